// idle_suspend.test.mjs - the official OpenAI Node SDK against a service oversub suspends when
// idle (issue 25): served, suspended for want of requests, woken by the next request (the same
// process answers), 503 with Retry-After for a deadline shorter than the resume, retried by
// the SDK until served, and an operator's suspend that traffic does not undo.
// Usage: node idle_suspend.test.mjs GATEWAY_URL API_URL
import OpenAI from "openai";

const [gw, api] = process.argv.slice(2);
let pass = 0, fail = 0;
const ok = (name, cond, got) => {
  if (cond) pass++;
  else { fail++; console.log(`FAIL: ${name}: ${JSON.stringify(got)}`); }
};
const svc = async () => (await fetch(`${api}/v1/services/chat`)).json();
const state = async () => (await svc()).state;
const waitFor = async (f, ms) => {
  const end = Date.now() + ms;
  while (Date.now() < end) { if (await f()) return true; await new Promise((r) => setTimeout(r, 50)); }
  return false;
};
const events = async () => (await (await fetch(`${api}/v1/events?since=0`)).json()).events;
const post = (path) => fetch(`${api}${path}`, { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
const client = (o = {}) => new OpenAI({ baseURL: `${gw}/chat/v1`, apiKey: "sk-test", maxRetries: 0, ...o });
const ask = (c, opts) => c.chat.completions.create(
  { model: "fake-model", messages: [{ role: "user", content: "hello there" }], max_tokens: 4 }, opts);

// 1. served while running
const first = await ask(client());
const words = first.choices?.[0]?.message?.content;
ok("served while running", typeof words === "string" && words.length > 0, first);
const pid = (await svc()).pid;

// 2. no request for idle_suspend_ms: suspended (reason idle), the process alive
ok("suspended for idleness", await waitFor(async () => (await state()) === "suspended", 30000), await svc());
ok("an idle suspend event", (await events()).some((e) => e.service === "chat" && e.reason === "idle"),
   (await events()).filter((e) => e.service === "chat").slice(-4));
ok("held for idleness", (await svc()).suspend_held === true, await svc());

// 3. a request whose deadline is shorter than the resume: 503 at once, with Retry-After
{
  let err;
  try { await ask(client(), { headers: { "X-Request-Deadline-Ms": "200" } }); } catch (e) { err = e; }
  ok("503 while resuming", err instanceof OpenAI.APIError && err.status === 503, String(err));
  ok("  reason resuming", err?.error?.reason === "resuming", err?.error);
  const ra = Number(err?.headers?.["retry-after"]);
  ok("  Retry-After in seconds", ra >= 1 && ra <= 600, err?.headers);
  ok("the request woke it", ["resuming", "running"].includes(await state()), await state());
}

// 4. the SDK retries after Retry-After and is served by the same process once it is back
{
  const r = await ask(client({ maxRetries: 5 }), { headers: { "X-Request-Deadline-Ms": "200" } });
  ok("served after the wake", r.choices?.[0]?.message?.content === words, r);
  ok("running again", (await state()) === "running", await state());
  ok("the same process (not reloaded)", (await svc()).pid === pid, { before: pid, now: (await svc()).pid });
}

// 5. idle again; a request with the default deadline waits in the queue through the resume
{
  ok("suspended again", await waitFor(async () => (await state()) === "suspended", 30000), await svc());
  const r = await ask(client());
  ok("a queued request is served after the resume", r.choices?.[0]?.message?.content === words, r);
  ok("the same process again", (await svc()).pid === pid, (await svc()).pid);
}

// 6. an operator's suspend: traffic gets 503 (reason suspended) and does not resume it
{
  ok("operator suspend", (await post("/v1/services/chat/suspend")).status === 200, "");
  ok("suspended by the operator", await waitFor(async () => (await state()) === "suspended", 30000), await svc());
  let err;
  try { await ask(client()); } catch (e) { err = e; }
  ok("503 for an operator's suspend", err instanceof OpenAI.APIError && err.status === 503 &&
     err?.error?.reason === "suspended", String(err));
  ok("still suspended", (await state()) === "suspended", await state());
  ok("operator resume", (await post("/v1/services/chat/resume")).status === 200, "");
  ok("running after the resume", await waitFor(async () => (await state()) === "running", 30000), await svc());
  const r = await ask(client());
  ok("served after the operator's resume", r.choices?.[0]?.message?.content === words, r);
}

// the counter is the suspends decided, as the event log has them (at least the three above;
// the service may have gone idle again since)
// (read within suspend_min_runtime_ms of the last resume: no idle suspend can come between)
const decided = (await events()).filter((e) => e.kind === "suspend" && ["idle", "user"].includes(e.reason)).length;
const m = await (await fetch(`${api}/metrics`)).text();
const n = Number((m.split("\n").find((l) => l.startsWith("oversub_suspends_total ")) || " 0").split(" ")[1]);
ok("the suspends counted, as decided", n >= 3 && n === decided, { metric: n, decided });
console.log(`idle_suspend.test: ${pass} passed, ${fail} failed`);
process.exit(fail === 0 ? 0 : 1);
