package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
)

const canary = "canary-Pw-7d41e0"

// syncBuffer is a log destination safe for the store's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestOpen_ErrorsKeepTheDSNSecret: no error of a failed Open repeats the
// DSN or its password (a wrong password, a URL that does not parse, a
// server that is not there).
func TestOpen_ErrorsKeepTheDSNSecret(t *testing.T) {
	ctx := context.Background()
	host := strings.Fields(pgtest.DSN())[0] // host=… of the test server (or its URL)
	if !strings.HasPrefix(host, "host=") {
		host = "host=127.0.0.1"
	}
	cases := []struct{ name, dsn, host, want string }{
		{"wrong password", host + " port=5432 dbname=postgres sslmode=disable user=" + pgtest.PasswordUser + " password=" + canary,
			strings.TrimPrefix(host, "host="), "cannot connect"},
		{"bad URL", "postgres://" + pgtest.PasswordUser + ":" + canary + "@127.0.0.1:notaport/db", "127.0.0.1", "does not parse"},
		{"no server", "host=/nonexistent-outbox-dir port=5432 user=x password=" + canary + " connect_timeout=5", "/nonexistent-outbox-dir", "cannot connect"},
		// What is wrong is named, without the value: before, every one of
		// these was only "does not parse".
		{"bad setting", "postgres://" + pgtest.PasswordUser + ":" + canary + "@127.0.0.1/db?pool_max_conns=" + canary, "127.0.0.1", "does not parse (it is not repeated here: it may hold a password): cannot parse pool_max_conns"},
		{"setting too small", "host=127.0.0.1 password=" + canary + " pool_max_conns=0", "127.0.0.1", "does not parse (it is not repeated here: it may hold a password): pool_max_conns too small"},
		{"bad sslmode", "host=127.0.0.1 password=" + canary + " sslmode=" + canary, "127.0.0.1", "does not parse (it is not repeated here: it may hold a password): failed to configure TLS (sslmode is invalid)"},
	}
	// A server without TLS answers a client's SSLRequest with 'N'.
	noTLS, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer noTLS.Close()
	go func() {
		for {
			c, err := noTLS.Accept()
			if err != nil {
				return
			}
			var req [8]byte
			if _, err := io.ReadFull(c, req[:]); err == nil {
				c.Write([]byte("N"))
			}
			c.Close()
		}
	}()
	port := strconv.Itoa(noTLS.Addr().(*net.TCPAddr).Port)
	cases = append(cases, struct{ name, dsn, host, want string }{"TLS refused",
		"host=127.0.0.1 port=" + port + " user=x password=" + canary + " sslmode=require connect_timeout=5", "127.0.0.1",
		"the server does not accept TLS, and the URL asks for it (sslmode=require or stronger)"})
	if u, err := url.Parse(pgtest.DSN()); err == nil && u.Scheme != "" { // OUTBOX_TEST_DATABASE_URL as a URL
		u.User = url.UserPassword(pgtest.PasswordUser, canary)
		cases[0].dsn, cases[0].host = u.String(), u.Hostname()
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := pgstore.Open(ctx, c.dsn, &pgstore.Options{Schema: pgtest.Schema(t)})
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded, want an error")
			}
			msg := err.Error()
			if strings.Contains(msg, canary) || strings.Contains(msg, c.dsn) || (c.host != "" && strings.Contains(msg, c.host)) {
				t.Fatalf("the error repeats the DSN, its password or its host: %s", msg)
			}
			if !strings.Contains(msg, c.want) {
				t.Fatalf("error %q does not say %q", msg, c.want)
			}
			t.Logf("%s", msg)
		})
	}
}

// TestListen_ReconnectsAndWakes kills the LISTEN connection of a store:
// it logs the loss without the DSN, reconnects, and wakes on another
// store's enqueue again.
func TestListen_ReconnectsAndWakes(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	var logs syncBuffer
	dsn := pgtest.DSN()
	if !strings.Contains(dsn, "://") {
		dsn += " password=" + canary // the test server trusts its superuser: a password it ignores
	}
	reg := prometheus.NewRegistry()
	a, err := pgstore.Open(ctx, dsn, &pgstore.Options{Schema: schema, Options: queue.Options{
		Logger:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer: reg,
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, Options: queue.Options{Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(30 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("gave up waiting for %s", what)
			}
		}
	}
	waitListening(t, schema, 2)
	// Kill every LISTEN connection of the schema; both stores reconnect.
	if _, err := pgtest.Admin().Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = $1`,
		`LISTEN "outbox_wake_`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	waitFor("the loss logged", func() bool { return strings.Contains(logs.String(), "listen connection lost") })
	waitListening(t, schema, 2)
	if n, err := gathered(reg, "outbox_pg_listen_reconnects_total"); err != nil || n < 1 {
		t.Errorf("outbox_pg_listen_reconnects_total = %v, %v; want at least 1", n, err)
	}

	// A's Notify hears B's enqueue.
	// Two rounds: a signal of the reconnect itself may still come in the
	// first; the second's can only be a NOTIFY of B's.
	for i := range 2 {
		select {
		case <-a.Notify():
		default:
		}
		if _, err := b.Enqueue(ctx, queuetest.Reply(fmt.Sprintf("r-%d", i), "u-1", "hi")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-a.Notify():
		case <-time.After(10 * time.Second):
			t.Fatal("no wake-up from the other store after the reconnect")
		}
	}
	ls, err := a.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute})
	if err != nil || len(ls) != 1 || ls[0].Key.EnvelopeID != "r-0" {
		t.Fatalf("Claim = %v, %v", ls, err)
	}
	if err := a.Commit(ctx, ls[0], queue.Outcome{State: envelope.StateSent}); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); strings.Contains(out, canary) || strings.Contains(out, pgtest.DSN()) {
		t.Fatalf("the log repeats the DSN or its password:\n%s", out)
	}
}

// TestOpen_NoMigrate refuses a schema that was never migrated, and
// Migrate is idempotent.
func TestOpen_NoMigrate(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	_, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, NoMigrate: true})
	if !errors.Is(err, pgstore.ErrNotMigrated) {
		t.Fatalf("Open with NoMigrate on an empty schema = %v, want ErrNotMigrated", err)
	}
	got, err := pgstore.Migrate(ctx, pgtest.Admin(), schema)
	if err != nil || len(got) != pgstore.SchemaVersion() {
		t.Fatalf("Migrate = %v, %v; want every version up to %d", got, err, pgstore.SchemaVersion())
	}
	if got, err := pgstore.Migrate(ctx, pgtest.Admin(), schema); err != nil || len(got) != 0 {
		t.Fatalf("Migrate again = %v, %v; want nothing applied", got, err)
	}
	s, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, NoMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := pgtest.Admin().Exec(ctx, `INSERT INTO `+schema+`.migrations (version, name) VALUES (999, 'from_the_future')`); err != nil {
		t.Fatal(err)
	}
	for _, no := range []bool{false, true} {
		if _, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, NoMigrate: no}); !errors.Is(err, pgstore.ErrSchemaNewer) {
			t.Fatalf("Open (NoMigrate %v) on a newer schema = %v, want ErrSchemaNewer", no, err)
		}
	}
	if _, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: "Bad-Name"}); err == nil || !strings.Contains(err.Error(), "schema name") {
		t.Fatalf("Open with a bad schema name = %v", err)
	}
}

// TestMigrate_Concurrent: processes starting at once migrate once.
func TestMigrate_Concurrent(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		all []int
	)
	for range 6 {
		wg.Go(func() {
			got, err := pgstore.Migrate(ctx, pgtest.Admin(), schema)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			all = append(all, got...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(all) != pgstore.SchemaVersion() {
		t.Fatalf("versions applied by 6 concurrent Migrate calls: %v, want each once", all)
	}
}
