// sites allocates from named functions, with the collector off, and keeps what two of
// them made: an index whose entries survive one in ten (each of its spans left a tenth
// full) and a cache kept whole; the rest is garbage. With runtime/pprof linked in, the runtime keeps a heap profile; the program
// writes it (as `go tool pprof` reads it) to its second argument after a collection,
// prints "ready PID" and holds still until killed.
//
//	sites MEMSTATS HEAP_PROFILE
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"time"
)

type entry struct {
	key   int64
	value [48]byte
	next  *entry
}

var index []*entry
var cache [][]byte

//go:noinline
func buildIndex(n int) {
	for i := 0; i < n; i++ {
		e := &entry{key: int64(i)}
		if i%10 == 0 {
			index = append(index, e)
		}
	}
}

//go:noinline
func fillCache(n int) {
	for i := 0; i < n; i++ {
		cache = append(cache, make([]byte, 1000))
	}
}

//go:noinline
func scratch(n int) int {
	sum := 0
	for i := 0; i < n; i++ {
		b := make([]byte, 200)
		sum += len(b)
	}
	return sum
}

func main() {
	debug.SetGCPercent(-1)
	buildIndex(2_000_000)
	fillCache(20_000)
	scratch(500_000)
	debug.SetGCPercent(100)
	runtime.GC()
	fmt.Println("collected")
	f, err := os.Create(os.Args[2])
	if err != nil {
		panic(err)
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		panic(err)
	}
	f.Close()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	b, _ := json.Marshal(m)
	os.WriteFile(os.Args[1], b, 0o644)
	fmt.Println("ready", os.Getpid())
	time.Sleep(time.Hour)
}
