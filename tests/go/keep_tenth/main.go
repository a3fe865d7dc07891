// keep_tenth allocates many small records, keeps every tenth, collects, and then holds
// still: every span of its size class is pinned by the tenth of its objects that
// survived. It writes the runtime's own accounting (runtime.MemStats, as JSON) to the
// file named by its first argument, prints "ready PID" and holds still for HOLD_SECONDS
// (an hour by default) before it exits.
//
//	keep_tenth STATS [RECORDS] [BIG_BYTES] [HOLD_SECONDS]
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"
)

type record struct {
	id   int64
	name [40]byte
	next *record
}

func main() {
	n := 2_000_000
	if len(os.Args) > 2 {
		n, _ = strconv.Atoi(os.Args[2])
	}
	big := 0
	if len(os.Args) > 3 {
		big, _ = strconv.Atoi(os.Args[3])
	}
	hold := 3600.0
	if len(os.Args) > 4 {
		hold, _ = strconv.ParseFloat(os.Args[4], 64)
	}
	all := make([]*record, n)
	for i := range all {
		all[i] = &record{id: int64(i)}
	}
	kept := make([]*record, 0, n/10)
	for i := 0; i < n; i += 10 {
		kept = append(kept, all[i])
	}
	all = nil
	// A large object, written so that its pages are resident.
	blob := make([]byte, big)
	for i := 0; i < len(blob); i += 4096 {
		blob[i] = 1
	}
	runtime.GC()
	// Printing and writing once before the figures are read: their first use grows
	// stacks and buffers that would otherwise come after them.
	fmt.Println("collected")
	os.WriteFile(os.Args[1], nil, 0o644)
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	b, _ := json.Marshal(m)
	if err := os.WriteFile(os.Args[1], b, 0o644); err != nil {
		panic(err)
	}
	fmt.Println("ready", os.Getpid())
	time.Sleep(time.Duration(hold * float64(time.Second)))
	runtime.KeepAlive(kept)
	runtime.KeepAlive(blob)
}
