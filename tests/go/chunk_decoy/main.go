// chunk_decoy is a cgo program with one block glibc mmaps alone (so glibc counts one such
// chunk) and, in its Go heap, an object whose pages begin as glibc begins a chunk it
// mmaps alone (prev_size 0, then a size with IS_MMAPPED set). It prints "ready" and
// waits for the end of stdin.
//
//	chunk_decoy
package main

/*
#include <stdlib.h>
#include <string.h>
static void *big(void) { void *p = malloc(1 << 20); if (p) memset(p, 1, 1 << 20); return p; }
*/
import "C"

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"unsafe"
)

func main() {
	big := C.big()
	page := os.Getpagesize()
	decoy := make([]byte, 16*page)
	for i := range decoy {
		decoy[i] = 0x5a
	}
	at := (page - int(uintptr(unsafe.Pointer(&decoy[0]))%uintptr(page))) % page
	// As in tests/c/chunk_decoy.c: a lookalike of glibc 2.36's and 2.41's chunks, whose
	// mapping ends where their size says, and one of 2.43's, which keep 8 bytes after.
	binary.LittleEndian.PutUint64(decoy[at+page:], 0)
	binary.LittleEndian.PutUint64(decoy[at+page+8:], uint64(2*page)|2)
	binary.LittleEndian.PutUint64(decoy[at+4*page:], 0)
	binary.LittleEndian.PutUint64(decoy[at+4*page+8:], uint64(page-8)|2)
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
	}
	runtime.KeepAlive(decoy)
	C.free(big)
}
