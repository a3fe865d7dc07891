// server is a net/http server that keeps a session cache: each /put request stores a
// batch of small sessions and drops most of the older ones, so the cache's survivors end
// up scattered over spans that once held the dropped ones. /stats collects and returns
// the runtime's own accounting (runtime.MemStats, as JSON). The heap profiler is linked
// in through net/http/pprof, as many servers have it. It prints "listening PORT".
//
//	server
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof"
	"runtime"
	"strconv"
	"sync"
)

type session struct {
	id    int64
	user  [24]byte
	attrs map[string]string
}

var (
	mu       sync.Mutex
	sessions = map[int64]*session{}
	next     int64
)

func put(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.Atoi(r.URL.Query().Get("n"))
	mu.Lock()
	for i := 0; i < n; i++ {
		next++
		sessions[next] = &session{id: next, attrs: map[string]string{"k": strconv.FormatInt(next, 10)}}
		// Keep one in ten of what came in a while ago.
		if old := next - 2000; old > 0 && old%10 != 0 {
			delete(sessions, old)
		}
	}
	size := len(sessions)
	mu.Unlock()
	fmt.Fprintln(w, size)
}

func stats(w http.ResponseWriter, r *http.Request) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	json.NewEncoder(w).Encode(m)
}

func main() {
	http.HandleFunc("/put", put)
	http.HandleFunc("/stats", stats)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println("listening", l.Addr().(*net.TCPAddr).Port)
	http.Serve(l, nil)
}
