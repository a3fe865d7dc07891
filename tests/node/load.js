// A load for session_service.js: CONCURRENCY keep-alive clients sending GET / for SECONDS,
// then GET /quit (unless the fourth argument is "stay"). Prints {"requests": N, "per_s": R}.
// Usage: node load.js PORT SECONDS CONCURRENCY [stay]
'use strict';
const http = require('http');
const [port, seconds, concurrency] = process.argv.slice(2, 5).map(Number);
const stay = process.argv[5] === 'stay';
const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
const end = Date.now() + seconds * 1000;
let requests = 0;
let failed = 0;

function get(path, done) {
  const req = http.get({ host: '127.0.0.1', port, path, agent }, (res) => {
    res.resume();
    res.on('end', () => done(res.statusCode === 200));
  });
  req.on('error', () => done(false));
}

function client(finished) {
  if (Date.now() >= end) return finished();
  get('/', (ok) => {
    if (ok) requests++;
    else failed++;
    client(finished);
  });
}

const started = Date.now();
let running = concurrency;
for (let c = 0; c < concurrency; c++) {
  client(() => {
    if (--running > 0) return;
    const s = (Date.now() - started) / 1000;
    console.log(JSON.stringify({ requests, failed, per_s: Math.round(requests / s) }));
    agent.destroy();
    if (!stay) get('/quit', () => {});
  });
}
