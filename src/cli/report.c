/* report.c - simulate/advise output: the table, JSON and an SVG plot written by hand */
#include "report.h"

#include <errno.h>
#include <string.h>

void report_table(FILE *f, const struct sim_result *r, size_t n)
{
    /* the suspends' column where a run had suspendable services (--suspend) */
    bool sus = false;
    for (size_t i = 0; i < n; i++)
        sus = sus || r[i].suspend_on;
    fprintf(f, "%-9s %5s %5s %-8s %6s %6s %6s %6s %5s %4s %7s %13s %13s%s %9s %8s\n", "policy",
            "ratio", "gpus", "feasible", "used", "p95", "held", "logic", "oom", "p0", "unmet",
            "degrades/wk", "evictions/wk", sus ? "   suspends/wk   preempt-min" : "", "lost-min",
            "max-wait");
    fprintf(f, "%-9s %5s %5s %-8s %6s %6s %6s %6s %5s %4s %7s %13s %13s%s %9s %8s\n", "", "", "",
            "", "mean", "used", "mean", "mean", "", "", "", "P1 / P2", "P1 / P2",
            sus ? "        P1 / P2  evict / susp" : "", "", "s");
    for (size_t i = 0; i < n; i++) {
        const struct sim_result *x = &r[i];
        char gpus[16], ratio[16], deg[32], ev[32], su[80] = "";
        if (x->n_gpus > 0)
            snprintf(gpus, sizeof(gpus), "%d", x->n_gpus);
        else
            snprintf(gpus, sizeof(gpus), "-");
        snprintf(ratio, sizeof(ratio), "%d.%02d", x->ratio_milli / 1000,
                 (x->ratio_milli % 1000) / 10);
        snprintf(deg, sizeof(deg), "%.1f / %.1f", x->degrades_per_week[1], x->degrades_per_week[2]);
        snprintf(ev, sizeof(ev), "%.1f / %.1f", x->evictions_per_week[1], x->evictions_per_week[2]);
        if (sus)
            snprintf(su, sizeof(su), " %14s %13s", "", "");
        if (sus && x->suspend_on) {
            char a[32], b[32];
            snprintf(a, sizeof(a), "%.1f / %.1f", x->suspends_per_week[1], x->suspends_per_week[2]);
            snprintf(b, sizeof(b), "%.0f / %.0f", x->evict_lost_minutes, x->suspend_lost_minutes);
            snprintf(su, sizeof(su), " %14s %13s", a, b);
        }
        fprintf(f,
                "%-9s %5s %5s %-8s %5.1f%% %5.1f%% %5.1f%% %5.1f%% %5llu %4llu %6.2f%% %13s %13s%s "
                "%9.0f %8lld\n",
                sim_policy_name(x->policy), ratio, gpus,
                x->n_gpus > 0 && x->feasible ? "yes" : "no", 100 * x->mean_used_util,
                100 * x->p95_used_util, 100 * x->mean_held_util, 100 * x->mean_logical_util,
                (unsigned long long)x->oom_events, (unsigned long long)x->p0_disruptions,
                100 * x->unmet_fraction, deg, ev, su, x->lost_service_minutes,
                (long long)x->max_wait_s);
        if (x->policy == POL_HINDSIGHT && x->lower_bound_gpus > 0)
            fprintf(f,
                    "%-9s %5s %5lld  (the true lower bound: ceil(peak of the summed demand / "
                    "VRAM))\n",
                    "", "", (long long)x->lower_bound_gpus);
    }
    /* where a ratio sweep stops binding: from that ratio up every oversub run is the same */
    size_t last = n, first = n, count = 0;
    for (size_t i = n; i-- > 0;) {
        if (r[i].policy != POL_OVERSUB)
            continue;
        if (last == n) {
            last = first = i;
            count = 1;
            continue;
        }
        const struct sim_result *a = &r[i], *z = &r[last];
        if (first != i + 1 && r[i + 1].policy != POL_OVERSUB)
            break; /* not one contiguous sweep */
        bool same = a->feasible == z->feasible && a->n_gpus == z->n_gpus &&
                    a->mean_used_util == z->mean_used_util && a->oom_events == z->oom_events &&
                    a->unmet_fraction == z->unmet_fraction && a->degrades[1] == z->degrades[1] &&
                    a->degrades[2] == z->degrades[2] && a->evictions[1] == z->evictions[1] &&
                    a->evictions[2] == z->evictions[2];
        if (!same)
            break;
        first = i;
        count++;
    }
    if (count > 1)
        fprintf(f,
                "oversub: every ratio from %d.%02d to %d.%02d runs the same: the ratio does not "
                "bind there (physical memory does)\n",
                r[first].ratio_milli / 1000, r[first].ratio_milli % 1000 / 10,
                r[last].ratio_milli / 1000, r[last].ratio_milli % 1000 / 10);
    /* why the runs that found nothing found nothing (one line per distinct reason) */
    for (size_t i = 0; i < n; i++) {
        const struct sim_result *x = &r[i];
        if (x->feasible || x->why_infeasible == NULL)
            continue;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = r[j].policy == x->policy && !r[j].feasible &&
                   r[j].why_infeasible == x->why_infeasible;
        if (!seen)
            fprintf(f, "%s: not feasible: %s\n", sim_policy_name(x->policy), x->why_infeasible);
    }
}

json_t *report_json(const struct sim_result *x)
{
    static const char *const cls[3] = {"online", "batch", "experiment"};
    json_t *deg = json_object(), *ev = json_object(), *su = json_object();
    for (int l = 0; l < 3; l++) {
        json_object_set_new(deg, cls[l], json_real(x->degrades_per_week[l]));
        json_object_set_new(ev, cls[l], json_real(x->evictions_per_week[l]));
        json_object_set_new(su, cls[l], json_real(x->suspends_per_week[l]));
    }
    json_t *o = json_object();
    json_object_set_new(o, "policy", json_string(sim_policy_name(x->policy)));
    json_object_set_new(o, "ratio", json_real((double)x->ratio_milli / 1000.0));
    json_object_set_new(o, "gpus", x->n_gpus > 0 ? json_integer(x->n_gpus) : json_null());
    json_object_set_new(o, "feasible", json_boolean(x->n_gpus > 0 && x->feasible));
    if (!x->feasible && x->why_infeasible)
        json_object_set_new(o, "infeasible_because", json_string(x->why_infeasible));
    json_object_set_new(o, "mean_used_util", json_real(x->mean_used_util));
    json_object_set_new(o, "p95_used_util", json_real(x->p95_used_util));
    json_object_set_new(o, "mean_held_util", json_real(x->mean_held_util));
    json_object_set_new(o, "mean_logical_util", json_real(x->mean_logical_util));
    json_object_set_new(o, "oom_events", json_integer((json_int_t)x->oom_events));
    json_object_set_new(o, "p0_disruptions", json_integer((json_int_t)x->p0_disruptions));
    json_object_set_new(o, "unmet_fraction", json_real(x->unmet_fraction));
    json_object_set_new(o, "degrades_per_week", deg);
    json_object_set_new(o, "evictions_per_week", ev);
    json_object_set_new(o, "suspends_per_week", su);
    json_object_set_new(o, "suspend", json_boolean(x->suspend_on));
    json_object_set_new(o, "wakes", json_integer((json_int_t)x->wakes));
    if (x->suspend_on) /* only then: a run without suspend reads as it always did */
        json_object_set_new(o, "migrations", json_integer((json_int_t)x->migrations));
    if (x->suspend_on)
        json_object_set_new(o, "relocations", json_integer((json_int_t)x->relocations));
    json_object_set_new(o, "lost_service_minutes", json_real(x->lost_service_minutes));
    json_object_set_new(o, "suspend_lost_minutes", json_real(x->suspend_lost_minutes));
    json_object_set_new(o, "suspend_transit_minutes", json_real(x->suspend_transit_minutes));
    json_object_set_new(o, "evict_lost_minutes", json_real(x->evict_lost_minutes));
    json_object_set_new(o, "max_suspended_s", json_integer(x->max_suspended_s));
    json_object_set_new(o, "max_wait_s", json_integer(x->max_wait_s));
    json_object_set_new(o, "mean_wait_s", json_real(x->mean_wait_s));
    json_object_set_new(o, "samples", json_integer(x->samples));
    json_object_set_new(o, "service_steps", json_integer(x->service_steps));
    json_object_set_new(o, "too_big", json_integer(x->too_big));
    if (x->policy == POL_HINDSIGHT)
        json_object_set_new(o, "lower_bound_gpus", json_integer(x->lower_bound_gpus));
    return o;
}

/* ---- SVG ------------------------------------------------------------------------------- */

static const char *const colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                     "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f",
                                     "#bcbd22", "#17becf", "#000000", "#aec7e8"};

static void esc(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '&':
            fputs("&amp;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

static void label(const struct sim_result *x, char *buf, size_t len)
{
    snprintf(buf, len, "%s %d.%02dx, %d GPUs", sim_policy_name(x->policy), x->ratio_milli / 1000,
             (x->ratio_milli % 1000) / 10, x->n_gpus);
}

/* A panel frame with axes and a title; returns nothing, draws at (x0, y0) size w x h. */
static void frame(FILE *f, double x0, double y0, double w, double h, const char *title,
                  const char *ylab, double ymax, const char *xlab, double xmin, double xmax)
{
    fprintf(f, "<g>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\">", x0,
            y0 - 10);
    esc(f, title);
    fprintf(f, "</text>\n");
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#444\"/>\n",
            x0, y0, w, h);
    for (int i = 0; i <= 4; i++) {
        double y = y0 + h - h * i / 4.0;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x0,
                y, x0 + w, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%.3g</text>\n",
                x0 - 4, y + 3, ymax * i / 4.0);
        double x = x0 + w * i / 4.0;
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%.3g</text>\n",
                x, y0 + h + 14, xmin + (xmax - xmin) * i / 4.0);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">", x0 + w / 2,
            y0 + h + 30);
    esc(f, xlab);
    fprintf(f,
            "</text>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" "
            "transform=\"rotate(-90 %.1f %.1f)\" text-anchor=\"middle\">",
            x0 - 40, y0 + h / 2, x0 - 40, y0 + h / 2);
    esc(f, ylab);
    fprintf(f, "</text>\n</g>\n");
}

int report_svg(const char *path, const struct trace *tr, const struct sim_result *r, size_t n)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    const double W = 960, PW = 820, PH = 220, X0 = 90;
    bool sweep = false;
    for (size_t i = 1; i < n; i++)
        sweep = sweep || (r[i].policy == POL_OVERSUB && r[0].policy == POL_OVERSUB) ||
                (r[i].policy == r[i - 1].policy && r[i].ratio_milli != r[i - 1].ratio_milli);
    int panels = sweep ? 3 : 2;
    double H = 80 + panels * (PH + 80) + 20 * (double)(n > 12 ? 12 : n);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n",
            W, H, W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    double hours = (double)(tr->t1 - tr->t0 + tr->step_s) / 3600.0;
    fprintf(f,
            "<text x=\"%.0f\" y=\"24\" font-size=\"16\" font-weight=\"bold\">oversub simulate: "
            "%zu services, %.1f hours</text>\n",
            X0, tr->n, hours);
    /* panel 1: used utilisation over time */
    double y0 = 60;
    frame(f, X0, y0, PW, PH, "Used utilisation over time (memory really in use / VRAM)", "used",
          1.0, "hours since the trace began", 0.0, hours);
    size_t shown = 0;
    for (size_t i = 0; i < n && shown < 12; i++) {
        if (r[i].used_series == NULL || r[i].n_series == 0)
            continue;
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.2\" points=\"",
                colors[shown % 12]);
        size_t stride = r[i].n_series > 2000 ? r[i].n_series / 2000 : 1;
        for (size_t k = 0; k < r[i].n_series; k += stride) {
            double x = X0 + PW * (double)k / (double)(r[i].n_series > 1 ? r[i].n_series - 1 : 1);
            double v = r[i].used_series[k] > 1.0 ? 1.0 : r[i].used_series[k];
            fprintf(f, "%.1f,%.1f ", x, y0 + PH - PH * v);
        }
        fprintf(f, "\"/>\n");
        shown++;
    }
    /* panel 2: degrades and evictions per step */
    y0 += PH + 80;
    uint32_t emax = 1;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; r[i].event_series && k < r[i].n_series; k++)
            if (r[i].event_series[k] > emax)
                emax = r[i].event_series[k];
    bool sus = false;
    for (size_t i = 0; i < n; i++)
        sus = sus || r[i].suspend_on;
    frame(f, X0, y0, PW, PH,
          sus ? "Degrades, suspends and evictions over time (per step)"
              : "Degrades and evictions over time (per step)",
          "events", (double)emax, "hours since the trace began", 0.0, hours);
    shown = 0;
    for (size_t i = 0; i < n && shown < 12; i++) {
        if (r[i].event_series == NULL || r[i].n_series == 0) {
            continue;
        }
        for (size_t k = 0; k < r[i].n_series; k++) {
            if (r[i].event_series[k] == 0)
                continue;
            double x = X0 + PW * (double)k / (double)(r[i].n_series > 1 ? r[i].n_series - 1 : 1);
            double hgt = PH * (double)r[i].event_series[k] / (double)emax;
            fprintf(f,
                    "<rect x=\"%.1f\" y=\"%.1f\" width=\"1.5\" height=\"%.1f\" fill=\"%s\" "
                    "fill-opacity=\"0.7\"/>\n",
                    x + (double)shown * 0.5, y0 + PH - hgt, hgt, colors[shown % 12]);
        }
        shown++;
    }
    /* panel 3: the ratio sweep */
    if (sweep) {
        y0 += PH + 80;
        double rmax = 0, rmin = 1e9;
        int32_t gmax = 1;
        for (size_t i = 0; i < n; i++) {
            if (r[i].policy != POL_OVERSUB)
                continue;
            double q = (double)r[i].ratio_milli / 1000.0;
            rmax = q > rmax ? q : rmax;
            rmin = q < rmin ? q : rmin;
            gmax = r[i].n_gpus > gmax ? r[i].n_gpus : gmax;
        }
        frame(f, X0, y0, PW, PH, "Ratio sweep: mean used utilisation (blue), GPUs (red, right)",
              "mean used", 1.0, "oversell ratio", rmin, rmax);
        for (int pass = 0; pass < 2; pass++) {
            fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                    pass == 0 ? colors[0] : colors[1]);
            for (size_t i = 0; i < n; i++) {
                if (r[i].policy != POL_OVERSUB)
                    continue;
                double q = (double)r[i].ratio_milli / 1000.0;
                double x = X0 + PW * (rmax > rmin ? (q - rmin) / (rmax - rmin) : 0.5);
                double v = pass == 0 ? r[i].mean_used_util : (double)r[i].n_gpus / (double)gmax;
                fprintf(f, "%.1f,%.1f ", x, y0 + PH - PH * v);
            }
            fprintf(f, "\"/>\n");
        }
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\">%d GPUs</text>\n", X0 + PW + 4,
                y0 + 10, gmax);
    }
    /* legend */
    double ly = y0 + PH + 50;
    shown = 0;
    for (size_t i = 0; i < n && shown < 12; i++) {
        if (r[i].used_series == NULL)
            continue;
        char lb[96];
        label(&r[i], lb, sizeof(lb));
        fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", X0,
                ly - 10, colors[shown % 12]);
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" font-size=\"12\">", X0 + 18, ly);
        esc(f, lb);
        fprintf(f, " - mean used %.1f%%</text>\n", 100 * r[i].mean_used_util);
        ly += 20;
        shown++;
    }
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0)
        return -1;
    return 0;
}
