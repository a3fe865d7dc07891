// Loaded into every Node.js process of a recording (NODE_OPTIONS=--require): hands the
// recorder this isolate's heap as V8 counts it (v8.getHeapSpaceStatistics and
// v8.getHeapStatistics), written to a file of the recording's that the recorder reads
// at each snapshot: every FRAGSCOPE_V8_MS milliseconds on a timer that does not keep
// the process alive, and as it exits. A timer runs only when the event loop is free: the
// recorder says how old the figures are. Nothing else of the program is touched.
'use strict';
(() => {
  const dir = process.env.FRAGSCOPE_V8_DIR;
  if (!dir) return;
  let v8, fs, threadId;
  try {
    v8 = require('v8');
    fs = require('fs');
    threadId = require('worker_threads').threadId;
  } catch {
    return;
  }
  const path = `${dir}/${process.pid}-${threadId}`;
  const heapKeys = ['total_heap_size', 'total_physical_size', 'used_heap_size', 'heap_size_limit',
    'malloced_memory', 'external_memory', 'number_of_native_contexts'];
  const write = () => {
    try {
      const lines = [`time_ms ${Date.now()}`, `node ${process.version}`];
      for (const s of v8.getHeapSpaceStatistics()) {
        lines.push(`space ${s.space_name} ${s.space_size} ${s.space_used_size} ` +
          `${s.space_available_size} ${s.physical_space_size}`);
      }
      const h = v8.getHeapStatistics();
      for (const k of heapKeys) lines.push(`heap ${k} ${h[k] || 0}`);
      // Renamed into place whole: the recorder never reads half a file.
      fs.writeFileSync(`${path}.tmp`, lines.join('\n') + '\n');
      fs.renameSync(`${path}.tmp`, path);
    } catch {
      // The recording ended (its directory is gone) or the disk is full: nothing to say.
    }
  };
  write();
  setInterval(write, Number(process.env.FRAGSCOPE_V8_MS) || 100).unref();
  process.on('exit', write);
})();
