# oversub.bash - bash completion for the oversub CLI: commands, each command's flags, the
# values of --class and --restart, files for the trace options, and service ids from the
# daemon ('oversub list --ids', quiet and bounded to 2 s when the daemon does not answer).
#
#   source deploy/completion/oversub.bash
#   # or: install -m 644 deploy/completion/oversub.bash /etc/bash_completion.d/oversub
#
# The flag lists follow each command's --help (tests/cli/test_cli.sh checks they agree).

_oversub_commands="status list deploy ready resize release suspend resume usage events explain queue logs gpu
ratio simulate advise demo help"

# A command's flags; a trailing '=' marks one that takes a value.
_oversub_flags() {
    local trace="--genai= --services= --usage= --buffer= --floor= --classes= --pods= --window=
        --gpus= --policy= --ratio= --evict-budget= --unmet-budget= --max-wait= --predict-trust=
        --floor-start= --degrade= --suspend= --suspend-host-mib= --suspend-residual= --relocate --json --plot= --events= --quiet
        --history="
    case $1 in
    list) echo "--ids" ;;
    deploy)
        echo "--class= --vram= --min-vram= --gpus= --compute= --exclusive --resumable --no-queue
            --dry-run --wait --timeout= --restart-cost= --batch= --min-batch= --grace= --backend=
            --max-inflight= --max-queue= --queue-timeout= --control-url= --env= --user=
            --workdir= --checkpoint-dir= --restart= --max-restarts= --suspend= --suspend-url=
            --idle-suspend="
        ;;
    ready) echo "--timeout=" ;;
    resize) echo "--vram= --min-vram= --batch=" ;;
    usage) echo "--vram= --compute=" ;;
    events) echo "--since= --last= -n= --follow -f" ;;
    logs) echo "--lines= -n= --follow -f" ;;
    simulate) echo "$trace" ;;
    advise) echo "$trace --from-daemon --url=" ;;
    demo) echo "--url= --pace= --keep" ;;
    esac
}

# The same on one line, with a space on each side: " --class= --vram= ... ".
_oversub_flagset() {
    local -a f
    read -r -d '' -a f < <(_oversub_flags "$1")
    echo " ${f[*]} "
}

# The daemon's service ids, or nothing.
_oversub_ids() {
    local cli=$1
    shift
    if command -v timeout >/dev/null 2>&1; then
        timeout 2 "$cli" "$@" list --ids 2>/dev/null
    else
        "$cli" "$@" list --ids 2>/dev/null
    fi
}

_oversub() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=
    [ "$COMP_CWORD" -gt 0 ] && prev=${COMP_WORDS[COMP_CWORD - 1]}
    local cli=${COMP_WORDS[0]} cmd='' w i npos=0 rest=0
    local -a url=()
    COMPREPLY=()
    # the command, the daemon's address, and how many positional arguments come before cur
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in
        --url)
            url=(--url "${COMP_WORDS[i + 1]}")
            ((i++))
            ;;
        --url=*) url=("$w") ;;
        --)
            [ -n "$cmd" ] && rest=1
            ;;
        -*)
            # skip the value of a flag that takes one
            if [ -n "$cmd" ] && [[ $(_oversub_flagset "$cmd") == *" $w= "* ]]; then
                ((i++))
            fi
            ;;
        *)
            if [ -z "$cmd" ]; then
                cmd=$w
            elif [ "$rest" = 0 ]; then
                ((npos++))
            fi
            ;;
        esac
    done
    if [ "$rest" = 1 ]; then # a managed service's program and its arguments
        mapfile -t COMPREPLY < <({
            compgen -c -- "$cur"
            compgen -f -- "$cur"
        } | sort -u)
        return 0
    fi
    case $prev in
    --class)
        mapfile -t COMPREPLY < <(compgen -W "online batch experiment" -- "$cur")
        return 0
        ;;
    --restart)
        mapfile -t COMPREPLY < <(compgen -W "never on-failure" -- "$cur")
        return 0
        ;;
    --suspend)
        mapfile -t COMPREPLY < <(compgen -W "cuda vllm sglang" -- "$cur")
        return 0
        ;;
    --policy)
        mapfile -t COMPREPLY < <(compgen -W "static brief oversub hindsight" -- "$cur")
        return 0
        ;;
    --services | --usage | --plot | --history)
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        return 0
        ;;
    --genai | --workdir | --checkpoint-dir)
        mapfile -t COMPREPLY < <(compgen -d -- "$cur")
        return 0
        ;;
    --url)
        return 0
        ;;
    esac
    if [ -n "$cmd" ] && [[ $prev == -* ]] && [[ $(_oversub_flagset "$cmd") == *" $prev= "* ]]; then
        return 0 # a value of the user's own: a size, a number
    fi
    if [ -z "$cmd" ]; then
        if [[ $cur == -* ]]; then
            mapfile -t COMPREPLY < <(compgen -W "--url --json --help --version" -- "$cur")
        else
            mapfile -t COMPREPLY < <(compgen -W "$_oversub_commands" -- "$cur")
        fi
        return 0
    fi
    if [[ $cur == -* ]]; then
        local flags
        flags=$(_oversub_flagset "$cmd")
        flags=${flags//=/}
        case $cmd in
        simulate | advise | demo | help) ;;
        *) flags="$flags --json --url" ;;
        esac
        mapfile -t COMPREPLY < <(compgen -W "$flags --help" -- "$cur")
        return 0
    fi
    case $cmd in
    ready | resize | release | suspend | resume | usage | explain | logs)
        if [ "$npos" = 0 ]; then
            mapfile -t COMPREPLY < <(compgen -W "$(_oversub_ids "$cli" "${url[@]}")" -- "$cur")
        fi
        ;;
    gpu)
        [ "$npos" = 0 ] && mapfile -t COMPREPLY < <(compgen -W "cordon uncordon drain" -- "$cur")
        ;;
    help)
        [ "$npos" = 0 ] && mapfile -t COMPREPLY < <(compgen -W "$_oversub_commands" -- "$cur")
        ;;
    esac
    return 0
}

complete -F _oversub oversub
