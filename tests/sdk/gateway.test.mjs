// gateway.test.mjs - the official OpenAI Node SDK against oversub's gateway, as a user drives it:
// a stream the user aborts, a request that times out and is retried, refusals the SDK retries
// after Retry-After-Ms, an error it parses, a body over the limit.
// Usage: node gateway.test.mjs GATEWAY_URL API_URL BACKEND_URL
import OpenAI from "openai";

const [gw, api, backend] = process.argv.slice(2);
let pass = 0, fail = 0;
const ok = (name, cond, got) => {
  if (cond) pass++;
  else { fail++; console.log(`FAIL: ${name}: ${JSON.stringify(got)}`); }
};
const metric = async (name) => {
  const t = await (await fetch(`${api}/metrics`)).text();
  const l = t.split("\n").find((x) => x.startsWith(name + " "));
  return l ? Number(l.split(" ")[1]) : 0; /* a series not there yet: nothing counted */
};
const waitFor = async (f, ms) => {
  const end = Date.now() + ms;
  while (Date.now() < end) { if (await f()) return true; await new Promise((r) => setTimeout(r, 50)); }
  return false;
};
const stats = async () => (await fetch(`${backend}/stats`)).json();
const inflight = (svc) => metric(`oversub_gateway_inflight{service="${svc}"}`);
const gone = (svc) => metric(`oversub_gateway_requests_total{service="${svc}",outcome="client_gone"}`);

const chat = new OpenAI({ baseURL: `${gw}/chat/v1`, apiKey: "sk-test", maxRetries: 0 });

// 1. a stream the user aborts after 5 chunks: the backend stops, the slot is free at once
{
  const before = await stats(), gone0 = await gone("chat");
  const ac = new AbortController();
  const stream = await chat.chat.completions.create(
    { model: "m", stream: true, messages: [{ role: "user", content: "chunks:400" }] },
    { signal: ac.signal });
  let n = 0, aborted = false;
  try {
    for await (const c of stream) { if (++n === 5) ac.abort(); }
  } catch (e) { aborted = e instanceof OpenAI.APIUserAbortError || e.name === "AbortError"; }
  ok("the user stopped reading after 5 chunks", n === 5, { n, aborted });
  ok("the gateway counts it client_gone",
     await waitFor(async () => (await gone("chat")) === gone0 + 1, 5000), await gone("chat"));
  ok("its slot is free", await waitFor(async () => (await inflight("chat")) === 0, 5000),
     await inflight("chat"));
  ok("the backend stopped generating (it saw its connection close)",
     await waitFor(async () => (await stats()).aborted === before.aborted + 1, 5000), await stats());
}

// 2. timeout 1 s with 2 retries on an 8 s request: three attempts, each cancelled upstream
{
  const before = await stats(), gone0 = await gone("chat");
  const t0 = Date.now();
  let err;
  try {
    await chat.chat.completions.create(
      { model: "m", messages: [{ role: "user", content: "delay:8000" }] },
      { timeout: 1000, maxRetries: 2 });
  } catch (e) { err = e; }
  ok("timed out", err instanceof OpenAI.APIConnectionTimeoutError, String(err));
  ok("three attempts, each gone from the gateway",
     await waitFor(async () => (await gone("chat")) === gone0 + 3, 5000), await gone("chat"));
  ok("and from the backend, long before 8 s each",
     await waitFor(async () => (await stats()).aborted === before.aborted + 3, 5000), await stats());
  ok("no attempt ran to the end", (await stats()).completed === before.completed, await stats());
  ok("it took about three timeouts, not three 8 s requests", Date.now() - t0 < 9000, Date.now() - t0);
}

// 3. refusals: 429 in OpenAI's shape, retried by the SDK after Retry-After-Ms
{
  const hold = fetch(`${gw}/one/slow?ms=4000&tag=hold`);
  await waitFor(async () => (await inflight("one")) === 1, 5000);
  const one = new OpenAI({ baseURL: `${gw}/one/v1`, apiKey: "sk-test", maxRetries: 0 });
  let err;
  try {
    await one.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }] });
  } catch (e) { err = e; }
  ok("a RateLimitError", err instanceof OpenAI.RateLimitError && err.status === 429, String(err));
  ok("its type, code and reason parsed",
     err && err.type === "rate_limit_error" && err.code === "overloaded" &&
       err.error?.reason === "queue_full",
     err && { type: err.type, code: err.code, error: err.error });
  const ms = Number(err?.headers?.["retry-after-ms"]);
  ok("Retry-After-Ms given", ms >= 100 && ms <= 60000, err?.headers);
  // with retries, the SDK waits as told and gets through once the slot frees
  const retrying = new OpenAI({ baseURL: `${gw}/one/v1`, apiKey: "sk-test", maxRetries: 6 });
  const r = await retrying.chat.completions.create(
    { model: "m", messages: [{ role: "user", content: "hi" }] });
  ok("retried until served", r.choices?.[0]?.message?.content === "ok", r);
  await hold;
}

// 4. a body over 64 MiB: the SDK gets the 413, not a reset
{
  let err;
  try {
    await chat.chat.completions.create(
      { model: "m", messages: [{ role: "user", content: "x".repeat(70 * 1024 * 1024) }] });
  } catch (e) { err = e; }
  ok("413 read by the SDK", err instanceof OpenAI.APIError && err.status === 413, String(err));
  ok("  code body_too_large", err?.code === "body_too_large", err?.code);
}

console.log(`test_sdk: ${pass} passed, ${fail} failed`);
process.exit(fail === 0 ? 0 : 1);
