// dashboard.test.mjs - oversubd's dashboard (src/daemon/web/dashboard.html) in headless Chromium,
// driven by puppeteer-core (tests/sdk/node_modules) against a real oversubd started by
// tests/integration/test_dashboard.sh. DOM assertions: waits for selectors and conditions, never
// fixed sleeps. Prints "FAIL: ..." for each failed check and "dashboard: N passed, M failed".
//
// Environment: OSUB_URL (http://127.0.0.1:PORT), OSUB_SOCK (the Unix socket), OSUB_BIN (oversubd),
// OSUB_DIR (the daemon's folder: st.db, tok), OSUB_PID (the running daemon), OSUB_CHROMIUM,
// OSUB_SDK (tests/sdk), OSUB_ART (the folder for screenshots).
import { createRequire } from 'node:module';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

const env = (k) => { const v = process.env[k]; if (!v) { console.log(`dashboard: ${k} is not set`); process.exit(2); } return v; };
const URL0 = env('OSUB_URL'), SOCK = env('OSUB_SOCK'), BIN = env('OSUB_BIN'), DIR = env('OSUB_DIR');
const CHROMIUM = env('OSUB_CHROMIUM'), ART = env('OSUB_ART');
const require = createRequire(path.join(env('OSUB_SDK'), 'package.json'));
const puppeteer = require('puppeteer-core');
const TOKEN = 'dash-admin-' + Math.random().toString(16).slice(2);
const ROOT = typeof process.getuid === 'function' && process.getuid() === 0;
const T = 10000;                                  // every wait's limit

let pass = 0, fail = 0;
const ok = () => { pass++; };
const bad = (what) => { fail++; console.log('FAIL: ' + what); };
const check = (what, cond) => (cond ? ok() : bad(what));
const expect = (what, want, got) => (want === got ? ok() : bad(`${what}: got '${got}', want '${want}'`));
async function step(what, fn) { // a check that is a wait: a timeout is one failure, not the end
  try { await fn(); ok(); return true; } catch (e) { bad(`${what}: ${String(e && e.message || e).split('\n')[0]}`); return false; }
}

// the Unix socket: everything is allowed there
function sock(method, p, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath: SOCK, method, path: p, headers: { 'Content-Type': 'application/json' } }, (r) => {
      let d = '';
      r.on('data', (c) => { d += c; });
      r.on('end', () => { let j = null; try { j = d ? JSON.parse(d) : null; } catch { j = d; } resolve({ status: r.statusCode, body: j }); });
    });
    req.on('error', reject);
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}
async function getJSON(url) { const r = await fetch(url); return r.json(); }

// the second daemon, started here: its pid goes to DIR/d2.pid for the shell's clean-up
let d2 = null;
function startDaemon2(port) {
  return new Promise((resolve) => {
    const out = fs.openSync(path.join(DIR, 'out2'), 'a'), err = fs.openSync(path.join(DIR, 'err2'), 'a');
    const p = spawn(BIN, ['--listen', `127.0.0.1:${port}`, '--socket', SOCK, '--state', path.join(DIR, 'st.db'),
      '--gpus', 'sim:4x81920', '--tick-ms', '100', '--token-file', path.join(DIR, 'tok')], { stdio: ['ignore', out, err] });
    fs.writeFileSync(path.join(DIR, 'd2.pid'), String(p.pid));
    let done = false;
    const finish = (v) => { if (!done) { done = true; clearInterval(iv); resolve(v); } };
    p.on('exit', () => finish(null));
    const iv = setInterval(() => {
      const txt = fs.readFileSync(path.join(DIR, 'out2'), 'utf8');
      if (txt.includes(`listening on http://127.0.0.1:${port}`)) finish(p);
    }, 50);
  });
}
async function daemon2(port) { // the first may take a moment to let go of its state and port
  fs.writeFileSync(path.join(DIR, 'tok'), TOKEN + '\n', { mode: 0o600 });
  fs.chmodSync(path.join(DIR, 'tok'), 0o600);
  const until = Date.now() + 8000;
  while (Date.now() < until) {
    fs.writeFileSync(path.join(DIR, 'out2'), '');
    const p = await startDaemon2(port);
    if (p) return p;
    await new Promise((r) => setTimeout(r, 200));
  }
  return null;
}
function gone(pid) { try { process.kill(pid, 0); return false; } catch { return true; } }

const browser = await puppeteer.launch({
  executablePath: CHROMIUM, headless: true,
  args: ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
});
const pageErrors = [];
async function open(url) {
  const page = await browser.newPage();
  page.setDefaultTimeout(T);
  await page.setViewport({ width: 1400, height: 1000 });
  page.on('pageerror', (e) => pageErrors.push('page error: ' + e.message));
  page.on('console', (m) => { if (/Content.Security.Policy|Refused to/i.test(m.text())) pageErrors.push('console: ' + m.text()); });
  await page.goto(url, { waitUntil: 'domcontentloaded' });
  return page;
}
const text = (page, sel) => page.$eval(sel, (e) => e.textContent);
const attr = (page, sel, a) => page.$eval(sel, (e, a) => e.getAttribute(a), a);
const fmt = (v) => (Math.abs(v) < 1024 ? v + ' MiB' : (Math.round((v / 1024) * 10) / 10) + ' GiB');

let code = 0;
try {
  // ---- 1. the first daemon, no token: GPUs, services, events, the chart --------------------------
  const page = await open(URL0 + '/');
  if (!(await step('connection shown live', () => page.waitForSelector('#conn[data-state="live"]'))))
    throw new Error('the page never went live: nothing else to check');
  const pool = await getJSON(URL0 + '/v1/pool');
  for (const g of pool.gpus) {
    const sel = `[data-gpu="${g.index}"]`;
    if (!(await step(`GPU ${g.index} rendered`, () => page.waitForSelector(sel)))) continue;
    await step(`GPU ${g.index} shows the pool's held figure`, () => page.waitForFunction(
      (sel, h) => document.querySelector(sel).getAttribute('data-held-mib') === String(h), { timeout: T }, sel, g.held_mib));
    const t = await text(page, sel);
    check(`GPU ${g.index} text names it and its figures: ${t}`, t.includes(`GPU ${g.index}`) && t.includes(fmt(g.held_mib)) &&
      t.includes(fmt(g.logical_mib)) && t.includes(fmt(g.granted_mib)) && t.includes('used'));
    const bars = await page.$$eval(`${sel} [data-bar]`, (b) => b.map((x) => x.getAttribute('data-bar')).join(','));
    expect(`GPU ${g.index} bars`, 'used,held,granted,logical', bars);
  }
  expect('GPU cards', pool.gpus.length, (await page.$$('[data-gpu]')).length);
  const vramMark = await page.$eval('[data-gpu="0"] [data-bar="granted"] [data-mark="vram"]', (m) => !m.hidden);
  check('GPU 0 marks its physical VRAM', vramMark);

  const svcs = (await getJSON(URL0 + '/v1/services')).services;
  check('services were submitted', svcs.length >= 3);
  for (const s of svcs) {
    const sel = `[data-service="${s.id}"]`;
    if (!(await step(`service ${s.id} rendered`, () => page.waitForSelector(sel)))) continue;
    const cls = await text(page, `${sel} [data-col="class"]`);
    const state = await text(page, `${sel} [data-col="state"]`);
    const grant = await text(page, `${sel} [data-col="grant"]`);
    expect(`${s.id} class`, s.class, cls);
    check(`${s.id} state '${state}' (API: ${s.state})`, (s.id === 'exp-sus' ? ['suspended'] : ['loading', 'running']).includes(state) && state === (await attr(page, sel, 'data-state')));
    check(`${s.id} grant '${grant}' shows ${fmt(s.grant_mib)}`, grant.startsWith(fmt(s.grant_mib)));
    expect(`${s.id} grant attribute`, String(s.grant_mib), await attr(page, sel, 'data-grant-mib'));
    const gpus = await text(page, `${sel} [data-col="gpus"]`);
    expect(`${s.id} GPUs`, s.placement.map((p) => p.gpu).join(', '), gpus);
    const chip = await page.$(`[data-gpu="${s.placement[0].gpu}"] [data-on-gpu="${s.id}"]`);
    check(`${s.id} listed under its GPU`, chip !== null);
  }
  // the suspended service: its counts, its state's explanation, the pool's suspended box
  expect('exp-sus degrades / suspends / evictions', '0 / 1 / 0', await text(page, '[data-service="exp-sus"] [data-col="pre"]'));
  const why = await page.$eval('[data-service="exp-sus"] [data-col="state"]', (c) => c.title);
  check(`exp-sus state explained: ${why}`, why.includes('host memory') && why.includes('held by an operator'));
  const pool1 = await getJSON(URL0 + '/v1/pool');
  const box = await text(page, '[data-stat="suspended"]');
  check(`the pool's suspended box: ${box}`, box.startsWith(String(pool1.suspended.services)) && pool1.suspended.services === 1 &&
    box.includes(fmt(pool1.suspended.host_budget_mib)));
  const classes = new Set(svcs.map((s) => s.class));
  check('services of every class', ['online', 'batch', 'experiment'].every((c) => classes.has(c)));

  await step('the event list shows an admission with its reason', () => page.waitForSelector('#events li[data-kind="admit"] [data-reason="fits"]'));
  const admit = await page.$$eval('#events li[data-kind="admit"]', (l) => l.map((x) => x.textContent).join('\n'));
  check('an admission message names chat', /admitted chat \(online/.test(admit));
  await step('utilisation chart has samples and lines', () => page.waitForFunction(
    () => +document.querySelector('#util').getAttribute('data-samples') >= 2 &&
      ['used', 'held', 'logical'].every((k) => document.querySelector(`#util polyline[data-series="${k}"]`)), { timeout: T }));

  // ---- 2. live: a submit and a release reach the open page through the long-polled events -------
  const t0 = Date.now();
  const sub = await sock('POST', '/v1/services', { id: 'late', class: 'batch', vram: '10GiB' });
  expect('late submitted', 201, sub.status);
  await step('late appears live', () => page.waitForSelector('[data-service="late"]'));
  await step('late\'s start in the event list (long-poll)', () => page.waitForFunction(
    () => [...document.querySelectorAll('#events li[data-kind="start"]')].some((l) => l.textContent.includes('started late')), { timeout: T }));
  const liveMs = Date.now() - t0;
  check(`late arrived before a long poll's wait (${liveMs} ms)`, liveMs < 5000);
  expect('late class', 'batch', await text(page, '[data-service="late"] [data-col="class"]'));
  expect('late grant', '10 GiB', await text(page, '[data-service="late"] [data-col="grant"]'));

  const rel = await sock('DELETE', '/v1/services/exp-a');
  expect('exp-a released', 200, rel.status);
  await step('exp-a disappears or shows released', () => page.waitForFunction(() => {
    const r = document.querySelector('[data-service="exp-a"]');
    return r === null || r.getAttribute('data-state') === 'released';
  }, { timeout: T }));
  await step('the release in the event list with its reason', () => page.waitForFunction(() =>
    [...document.querySelectorAll('#events li')].some((l) => l.textContent.includes('exp-a') &&
      /release/.test(l.getAttribute('data-kind')) && l.querySelector('[data-reason]').getAttribute('data-reason') !== ''), { timeout: T }));
  const relText = await page.$$eval('#events li', (l) => l.filter((x) => /release/.test(x.getAttribute('data-kind'))).map((x) => x.textContent)[0] || '');
  check(`the release event shows a reason: ${relText}`, /reason: \S+/.test(relText));
  await step('GPU chips follow the release', () => page.waitForFunction(() => document.querySelector('[data-on-gpu="exp-a"]') === null, { timeout: T }));

  // never innerHTML with API strings; a service id with markup cannot exist, so the check is that
  // the page's DOM only holds what it built
  const injected = await page.evaluate(() => document.querySelectorAll('#events img, #events script, #services img, #services script').length);
  expect('no markup from API strings', 0, injected);

  fs.mkdirSync(ART, { recursive: true });
  const shot = path.join(ART, 'dashboard.png');
  await page.screenshot({ path: shot, fullPage: true });
  console.log('dashboard: screenshot ' + shot);

  // ---- 3. the daemon goes away: the page says so, and comes back when it returns with a token ----
  const port = new URL(URL0).port;
  const pid1 = Number(env('OSUB_PID'));
  process.kill(pid1, 'SIGTERM');
  await step('disconnected shown', () => page.waitForSelector('#conn[data-state="disconnected"]'));
  check('disconnected text', /disconnected/.test(await text(page, '#conn')));
  d2 = await daemon2(port);
  check('oversubd restarted with a token file on the same port', d2 !== null);
  if (d2) {
    await step('the open page reconnects', () => page.waitForSelector('#conn[data-state="live"]', { timeout: 15000 }));
    await step('the open page still shows chat after the restart', () => page.waitForSelector('[data-service="chat"][data-class="online"]'));

    // a managed service: its command's arguments are redacted without the admin token
    const job = { id: 'job', class: 'batch', vram: '2GiB', cuda_shim: false, command: ['/bin/sleep', '45'] };
    // (no CUDA shim: a clone in a 0700 folder is out of nobody's reach, and this is about the page)
    if (ROOT) job.user = 'nobody';
    const js = await sock('POST', '/v1/services', job);
    check(`managed job submitted (${js.status})`, js.status === 201 || js.status === 202);
    const pj = (await sock('GET', '/v1/services/job')).body;
    if (pj && pj.pid) fs.writeFileSync(path.join(DIR, 'job.pid'), String(pj.pid));
    const unauth = await fetch(URL0 + '/v1/services/late', { method: 'DELETE' });
    expect('a mutation without the token is refused', 401, unauth.status);

    await step('job appears live in the open page', () => page.waitForSelector('[data-service="job"]'));
    await step('its arguments are redacted without the token', () => page.waitForFunction(
      () => document.querySelector('[data-service="job"] [data-col="cmd"]').textContent === '/bin/sleep <redacted>', { timeout: T }));

    // a fresh page loads and renders everything with a token configured and none given
    const p2 = await open(URL0 + '/dashboard');
    await step('fresh page live with a token configured', () => p2.waitForSelector('#conn[data-state="live"]'));
    for (const id of ['chat', 'batch-a', 'late', 'job'])
      await step(`fresh page renders ${id}`, () => p2.waitForSelector(`[data-service="${id}"]`));
    await step('fresh page renders 4 GPUs', () => p2.waitForSelector('[data-gpu="3"]'));
    expect('no token kept yet', 'none', await attr(p2, '#tokenstate', 'data-token'));

    // a wrong token: the reads still work, the page says the token looks wrong
    await p2.type('#token', 'not-the-token');
    await p2.click('#tokenuse');
    await step('a wrong token is flagged', () => p2.waitForSelector('#tokenstate[data-token="doubtful"]'));

    // the admin token: kept for the tab, sent as Authorization: Bearer, the arguments show
    await p2.type('#token', TOKEN);
    await p2.click('#tokenuse');
    await step('the admin token unredacts the arguments', () => p2.waitForFunction(
      () => document.querySelector('[data-service="job"] [data-col="cmd"]').textContent === '/bin/sleep 45', { timeout: T }));
    expect('token state', 'set', await attr(p2, '#tokenstate', 'data-token'));
    expect('the token field is emptied', '', await p2.$eval('#token', (e) => e.value));
    await p2.reload({ waitUntil: 'domcontentloaded' });
    await step('after a reload the token is still used (sessionStorage)', () => p2.waitForFunction(
      () => { const c = document.querySelector('[data-service="job"] [data-col="cmd"]'); return c && c.textContent === '/bin/sleep 45'; }, { timeout: T }));
    // and with the token the page is still live: a release shows
    expect('late released', 200, (await sock('DELETE', '/v1/services/late')).status);
    await step('with the token: late disappears live', () => p2.waitForFunction(() => {
      const r = document.querySelector('[data-service="late"]');
      return r === null || r.getAttribute('data-state') === 'released';
    }, { timeout: T }));
    const shot2 = path.join(ART, 'dashboard-token.png');
    await p2.screenshot({ path: shot2, fullPage: true });
    console.log('dashboard: screenshot ' + shot2);
    await p2.click('#tokenforget');
    await step('forget drops the token', () => p2.waitForSelector('#tokenstate[data-token="none"]'));
    await sock('DELETE', '/v1/services/job');
  }
  check('no page errors or CSP refusals: ' + pageErrors.join('; '), pageErrors.length === 0);
} catch (e) {
  bad('driver: ' + (e && e.stack || e));
} finally {
  await browser.close().catch(() => {});
  if (d2) { d2.kill('SIGTERM'); await new Promise((r) => { if (d2.exitCode !== null) r(); else d2.on('exit', r); setTimeout(r, 5000); }); }
  try { const j = Number(fs.readFileSync(path.join(DIR, 'job.pid'), 'utf8')); if (j > 0 && !gone(j)) process.kill(j, 'SIGKILL'); } catch { /* none */ }
}
console.log(`dashboard: ${pass} passed, ${fail} failed`);
code = fail ? 1 : 0;
process.exit(code);
