// svc: a latency-sensitive HTTP service for the latency benchmark. Every request to / does
// the same fixed CPU work (-hashes rounds of SHA-256 over 4 KiB), so a request's latency is
// its work plus whatever the CPU limit and the neighbours add. /healthz answers at once;
// /gomaxprocs says what the Go runtime runs with. -calibrate D prints how many rounds take
// D on this machine, unthrottled, and exits. A request whose client has gone (timed out
// while it queued) is dropped before its work, as a server honouring cancellation does.
// -spin N makes it a neighbour instead: N threads spinning, all on for -on out of every
// -every (a bursting neighbour), or always with -on 0.
package main

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"runtime"
	"time"
)

var block = make([]byte, 4096)

func work(rounds int) [32]byte {
	var sum [32]byte
	for i := 0; i < rounds; i++ {
		copy(block, sum[:])
		sum = sha256.Sum256(block)
	}
	return sum
}

func calibrate(target time.Duration) int {
	work(200) // warm up
	rounds := 100
	for {
		start := time.Now()
		work(rounds)
		took := time.Since(start)
		if took > 200*time.Millisecond {
			return int(float64(rounds) * float64(target) / float64(took))
		}
		rounds *= 2
	}
}

// spin keeps `threads` OS threads busy: always (on 0), or for `on` out of every `every`,
// all threads together, each period starting on the wall clock's multiple of `every`.
func spin(threads int, on, every time.Duration) {
	runtime.GOMAXPROCS(threads)
	for i := 0; i < threads; i++ {
		go func() {
			runtime.LockOSThread()
			x := 0
			for {
				if on > 0 {
					now := time.Now()
					into := time.Duration(now.UnixNano()) % every
					if into >= on {
						time.Sleep(every - into)
						continue
					}
				}
				for j := 0; j < 100000; j++ {
					x += j
				}
			}
		}()
	}
	select {}
}

func main() {
	addr := flag.String("addr", ":8080", "listen address")
	hashes := flag.Int("hashes", 1000, "SHA-256 rounds over 4 KiB per request")
	cal := flag.Duration("calibrate", 0, "print the rounds that take this long here, and exit")
	spinners := flag.Int("spin", 0, "be a neighbour: this many threads spinning (no service)")
	on := flag.Duration("on", 0, "with -spin: spin this long out of every -every (0: always)")
	every := flag.Duration("every", time.Second, "with -spin and -on: the burst period")
	flag.Parse()
	if *cal > 0 {
		fmt.Println(calibrate(*cal))
		return
	}
	if *spinners > 0 {
		spin(*spinners, *on, *every)
	}
	rounds := *hashes
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Err() != nil { // the client gave up while the request queued: no work for nobody
			return
		}
		sum := work(rounds)
		fmt.Fprintf(w, "%x\n", sum[:4])
	})
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	http.HandleFunc("/gomaxprocs", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, runtime.GOMAXPROCS(0))
	})
	log.SetOutput(os.Stderr)
	log.Printf("serving %s, %d rounds per request, GOMAXPROCS %d", *addr, rounds, runtime.GOMAXPROCS(0))
	log.Fatal(http.ListenAndServe(*addr, nil))
}
