// An HTTP service that keeps a session for each request: a small object graph, of which
// one in ten is kept for the life of the service and the rest dropped when the next
// hundred requests have come (a cache that keeps its hits). Prints {"port": N} when it
// listens. GET /quit: it stays idle for a second, prints its V8 heap as V8 counts it (one
// JSON line: "quiet" and v8.getHeapSpaceStatistics()), stays idle for IDLE ms, and exits.
// Usage: node session_service.js [IDLE_MS]
'use strict';
const http = require('http');
const v8 = require('v8');
const idle = Number(process.argv[2] || 1000);
const kept = [];
let recent = [];
let served = 0;

function session(n) {
  const items = [];
  for (let i = 0; i < 8; i++) items.push({ i, label: 'item-' + n + '-' + i, at: Date.now() });
  return { id: n, user: 'user-' + (n % 997), items, note: 'x'.repeat(64 + (n % 64)) };
}

const server = http.createServer((req, res) => {
  if (req.url === '/quit') {
    res.end('bye\n');
    server.close();
    setTimeout(() => {
      const spaces = v8.getHeapSpaceStatistics();
      console.log(JSON.stringify({ quiet: process.pid, served, kept: kept.length, spaces }));
      setTimeout(() => process.exit(0), idle);
    }, 1000);
    return;
  }
  const s = session(served++);
  if (s.id % 10 === 0) kept.push(s);
  recent.push(s);
  if (recent.length >= 100) recent = [];
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify({ id: s.id, items: s.items.length }));
});
server.keepAliveTimeout = 1000;
server.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ port: server.address().port }));
});
