package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// TestDrill_Kill is the kill drill: outbox serve runs with the sink
// provider (idempotent, journalled); envelopes arrive over HTTP and from
// `outbox enqueue` processes while deliveries run; the daemon is SIGKILLed
// at random moments and restarted. At the end every acknowledged envelope
// must be delivered (or terminal, or unresolved with an explanation), no
// key may have been delivered twice, and the store must pass doctor.
//
// make test runs a short form (OUTBOX_DRILL_KILLS, default 4); make drill
// runs 50 kills and prints the figures. OUTBOX_DRILL_STORE=postgres (make
// drill STORE=postgres) runs it on the PostgreSQL store: the same load, the
// foreign appender's `outbox enqueue` then writes to the database.
func TestDrill_Kill(t *testing.T) {
	store := os.Getenv("OUTBOX_DRILL_STORE")
	switch store {
	case "", "files":
		store = "files"
	case "postgres":
	default:
		t.Fatalf("OUTBOX_DRILL_STORE=%q: want files or postgres", store)
	}
	killDrill(t, store, 4)
}

// TestDrill_KillPostgres is the short kill drill on PostgreSQL in make test.
func TestDrill_KillPostgres(t *testing.T) { killDrill(t, "postgres", 2) }

func killDrill(t *testing.T, store string, kills int) {
	if v, err := strconv.Atoi(os.Getenv("OUTBOX_DRILL_KILLS")); err == nil && v > 0 {
		kills = v
	}
	bin := buildBinary(t)
	data := t.TempDir()
	if store == "postgres" {
		usePG(t, pgtest.Schema(t)) // every child process inherits the store
	}
	const token = "drill-token-0123456789"
	envDir := t.TempDir()

	acks := newAckSet()
	start := func() (*daemon, string) {
		d, out, _ := launchServe(t, bin, data, []string{"INTERNAL_OUTBOX_TOKEN=" + token}, "--lease", "1s", "--sink-journal", "--rescan", "200ms")
		if d == nil {
			t.Fatalf("serve did not start:\n%s", out)
		}
		return d, d.base
	}

	client := &http.Client{Timeout: 2 * time.Second}
	for k := 0; k < kills; k++ {
		d, base := start()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		// HTTP producers.
		for p := 0; p < 2; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				postLoop(client, base, token, acks, stop, 0, func() string { return "u" + strconv.Itoa(rand.IntN(5)) },
					func(id, user string, _ int) []byte { return replyJSON(id, user) })
			}()
		}
		// A foreign appender process.
		wg.Add(1)
		go func() {
			defer wg.Done()
			appendLoop(bin, data, envDir, acks, stop, 0, func() (string, string) { return "c", "c" + strconv.Itoa(rand.IntN(3)) },
				func(id, user string, _ int) []byte { return replyJSON(id, user) })
		}()
		time.Sleep(time.Duration(150+rand.IntN(500)) * time.Millisecond)
		d.kill()
		close(stop)
		wg.Wait()
	}

	// Final run: let everything settle (expired leases are reconciled).
	d, base := start()
	_ = base
	counts := settle(t, bin, data)
	d.stop(t)

	if out, code := outbox(t, bin, "doctor", "--data", data); code != 0 {
		t.Fatalf("doctor after the drill: %s", out)
	}
	var q queue.Store
	var err error
	if store == "postgres" {
		q, err = pgstore.Open(context.Background(), os.Getenv(EnvDatabaseURL), &pgstore.Options{Schema: os.Getenv("OUTBOX_DATABASE_SCHEMA"), NoMigrate: true})
	} else {
		q, err = filestore.Open(data, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
	}
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	acked := acks.snapshot()
	lost, unresolved, delivered := checkAcked(t, q, acked)
	// No key delivered twice: the sink journals every Deliver call, and
	// every call follows a claim written to the index, so any repeat means
	// a lease was lost or ignored.
	per := sinkJournal(t, data, "telegram")
	dups, rows := repeated(per), rowsIn(counts)
	report := fmt.Sprintf("kill drill (%s): kills=%d acknowledged=%d rows=%d delivered=%d lost=%d duplicates=%d unresolved=%d deliver_calls=%d",
		store, kills, len(acked), rows, delivered, lost, dups, unresolved, len(per))
	t.Log(report)
	if os.Getenv("OUTBOX_DRILL_KILLS") != "" {
		fmt.Println(report)
	}
	if lost > 0 || dups > 0 {
		t.Fatalf("drill failed: %s", report)
	}
	// The sink can always answer Reconcile, so nothing may stay unresolved.
	if unresolved > 0 {
		t.Fatalf("drill: %d unresolved rows with a provider that always knows: %s", unresolved, report)
	}
}
