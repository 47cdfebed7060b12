package filestore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
)

var benchText = strings.Repeat("outbox bench filler text. ", 30)[:750]

func benchEnvelope(i int) *envelope.Envelope {
	payload, _ := json.Marshal(envelope.ReplyPayload{Text: benchText})
	return &envelope.Envelope{
		SchemaVersion: envelope.SchemaVersion, ID: fmt.Sprintf("b-%d", i), UserID: "bench-user",
		Channel: envelope.ChannelTelegram, Template: envelope.TemplateReply,
		Recipient: envelope.Recipient{ChatID: "10001"}, Payload: payload,
		CreatedAt: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
	}
}

func benchOpen(b *testing.B) *filestore.Queue {
	b.Helper()
	q, err := filestore.Open(b.TempDir(), &filestore.Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, RescanInterval: -1, DisableWatcher: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { q.Close() })
	return q
}

// BenchmarkQueue_Enqueue is one durable enqueue (validate, append + fsync,
// index) of a 1 KiB envelope from one goroutine.
func BenchmarkQueue_Enqueue(b *testing.B) {
	q := benchOpen(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := q.Enqueue(ctx, benchEnvelope(i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkQueue_EnqueueParallel is enqueues from many goroutines sharing
// fsyncs (group commit).
func BenchmarkQueue_EnqueueParallel(b *testing.B) {
	q := benchOpen(b)
	ctx := context.Background()
	var n atomicInt
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := q.Enqueue(ctx, benchEnvelope(n.next())); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkQueue_ClaimCommit is one claim and one fenced commit of a row.
func BenchmarkQueue_ClaimCommit(b *testing.B) {
	q := benchOpen(b)
	ctx := context.Background()
	envs := make([]*envelope.Envelope, b.N)
	for i := range envs {
		envs[i] = benchEnvelope(i)
	}
	for i := 0; i < len(envs); i += 500 {
		if _, err := q.Enqueue(ctx, envs[i:min(i+500, len(envs))]...); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "b", Lease: time.Minute})
		if err != nil || len(ls) != 1 {
			b.Fatal(ls, err)
		}
		if err := q.Commit(ctx, ls[0], queue.Outcome{State: envelope.StateSent}); err != nil {
			b.Fatal(err)
		}
	}
}

type atomicInt struct{ v atomic.Int64 }

func (a *atomicInt) next() int { return int(a.v.Add(1)) }

// BenchmarkQueue_TailerWake measures the wake latency of the tailer: a line
// appended through the foreign-appender path (flock, write, fsync — what
// `outbox enqueue` and other processes do; the store learns of it only
// through fsnotify) until the row is claimable. It reports p50 and p99.
func BenchmarkQueue_TailerWake(b *testing.B) {
	dir := b.TempDir()
	q, err := filestore.Open(dir, &filestore.Options{Options: queue.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, RescanInterval: -1, UnsyncedClaims: envelope.Channels})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := filestore.Append(dir, benchEnvelope(i)); err != nil {
			b.Fatal(err)
		}
		for {
			ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "b", Lease: time.Minute})
			if err != nil {
				b.Fatal(err)
			}
			if len(ls) == 1 {
				break
			}
			select {
			case <-q.Notify():
			case <-time.After(time.Second):
				b.Fatal("append not seen within 1s")
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
