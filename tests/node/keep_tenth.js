// Allocates N small records, keeps every tenth, waits for the collector to settle, prints
// its V8 heap as V8 counts it (one JSON line: "ready" and v8.getHeapSpaceStatistics()),
// stays idle for MS milliseconds, then exits: a V8 old space whose survivors are spread
// over every page the records filled.
// Usage: node keep_tenth.js [N [MS]]
'use strict';
const v8 = require('v8');
const n = Number(process.argv[2] || 2000000);
const idle = Number(process.argv[3] || 2000);
let all = [];
for (let i = 0; i < n; i++) all.push({ id: i, name: 'record-' + i, value: i * 3 });
const kept = [];
for (let i = 0; i < n; i += 10) kept.push(all[i]);
all = null;
if (global.gc) global.gc();
setTimeout(() => {
  const spaces = v8.getHeapSpaceStatistics();
  console.log(JSON.stringify({ ready: process.pid, kept: kept.length, spaces }));
  setTimeout(() => console.log(kept[kept.length - 1].id), idle);
}, 300);
