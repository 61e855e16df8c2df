// loadgen: an open-loop load generator. Requests are scheduled at a constant rate from the
// start, each sent by its own goroutine at its intended time whatever the earlier ones are
// doing, and each latency is measured from that intended time, so time spent queueing
// behind a slow server is counted (no coordinated omission). Latencies go into an
// HdrHistogram (1 µs to 60 s, 3 significant digits). Prints one JSON object.
package main

import (
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
)

type result struct {
	Rate     float64 `json:"rate"`
	Seconds  float64 `json:"seconds"`
	Sent     int64   `json:"sent"`
	OK       int64   `json:"ok"`
	Errors   int64   `json:"errors"`
	Timeouts int64   `json:"timeouts"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	P999     float64 `json:"p999_ms"`
	Max      float64 `json:"max_ms"`
	Mean     float64 `json:"mean_ms"`
	Late     float64 `json:"late_ms"` // the sender's own lag: the latest any request left after its intended time
}

func main() {
	url := flag.String("url", "", "the URL to load")
	rate := flag.Float64("rate", 100, "requests per second")
	duration := flag.Duration("duration", 10*time.Second, "how long to send")
	timeout := flag.Duration("timeout", 2*time.Second, "a request slower than this is a timeout (an error)")
	flag.Parse()
	if *url == "" {
		flag.Usage()
		os.Exit(2)
	}
	client := &http.Client{
		Timeout:   *timeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true},
	}
	hist := hdr.New(1, 60_000_000, 3)
	var mu sync.Mutex
	var ok, errs, timeouts int64
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / *rate)
	total := int64(duration.Seconds() * *rate)
	start := time.Now()
	var late time.Duration
	for i := int64(0); i < total; i++ {
		intended := start.Add(time.Duration(i) * interval)
		if d := time.Until(intended); d > 0 {
			time.Sleep(d)
		} else if -d > late {
			late = -d
		}
		wg.Add(1)
		go func(intended time.Time) {
			defer wg.Done()
			resp, err := client.Get(*url)
			failed := err != nil
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				failed = resp.StatusCode != http.StatusOK
			}
			took := time.Since(intended)
			if failed {
				if err != nil && os.IsTimeout(err) {
					atomic.AddInt64(&timeouts, 1)
				}
				atomic.AddInt64(&errs, 1)
			} else {
				atomic.AddInt64(&ok, 1)
			}
			mu.Lock()
			_ = hist.RecordValue(took.Microseconds())
			mu.Unlock()
		}(intended)
	}
	wg.Wait()
	ms := func(us int64) float64 { return float64(us) / 1000 }
	out := result{
		Rate: *rate, Seconds: duration.Seconds(), Sent: total, OK: ok, Errors: errs, Timeouts: timeouts,
		P50: ms(hist.ValueAtQuantile(50)), P99: ms(hist.ValueAtQuantile(99)), P999: ms(hist.ValueAtQuantile(99.9)),
		Max: ms(hist.Max()), Mean: hist.Mean() / 1000, Late: float64(late.Microseconds()) / 1000,
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}
