// churn allocates records of mixed sizes in rounds for a fixed amount of work, keeping
// a rolling window of survivors (some of every size class), and prints how long it took:
// a Go program whose heap is collected, grown and fragmented all the while.
//
//	churn [ROUNDS=30] [PER_ROUND=300000]
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

type small struct {
	a, b int64
	next *small
}

type medium struct {
	id   int64
	name [100]byte
	kids []*small
}

func main() {
	rounds, perRound := 30, 300_000
	if len(os.Args) > 1 {
		rounds, _ = strconv.Atoi(os.Args[1])
	}
	if len(os.Args) > 2 {
		perRound, _ = strconv.Atoi(os.Args[2])
	}
	start := time.Now()
	window := make([][]any, 8)
	sum := 0
	for r := 0; r < rounds; r++ {
		kept := make([]any, 0, perRound/20)
		for i := 0; i < perRound; i++ {
			var x any
			switch i % 3 {
			case 0:
				x = &small{a: int64(i)}
			case 1:
				x = &medium{id: int64(i)}
			default:
				x = make([]byte, 16+i%700)
			}
			if i%20 == 0 {
				kept = append(kept, x)
			}
			sum += i
		}
		window[r%len(window)] = kept
	}
	fmt.Println("elapsed_ms", time.Since(start).Milliseconds(), sum%7)
}
