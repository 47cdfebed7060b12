package pgstore_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/fake"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
	"github.com/outboxhq/outbox/queue/queuetest"
	"github.com/outboxhq/outbox/queue/worker"
	"github.com/outboxhq/outbox/render"
)

// A server that refuses new connections (the role's connection limit, or
// max_connections, taken by other programs) is what the worker's log says,
// not only "store_unavailable": the line carries the server's answer, which
// the store marks safe to log (queue.Loggable). Once connections are
// allowed again the worker goes on and delivers.
func TestWorker_LogsWhyTheDatabaseRefuses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	schema := pgtest.Schema(t)
	quiet := slog.New(slog.DiscardHandler)
	rw, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, Options: queue.Options{Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()

	role, dsn, terminate := limitedRole(t, schema, -1)
	admin := pgtest.Admin()
	s, err := pgstore.Open(ctx, dsn, &pgstore.Options{Schema: schema, NoMigrate: true, Options: queue.Options{Logger: quiet}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	logs := &syncBuffer{}
	rnd, err := render.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	p := fake.New(envelope.ChannelTelegram)
	w, err := worker.New(worker.Config{
		Store: s, Renderer: rnd, Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		Providers: map[envelope.Channel]channels.Provider{envelope.ChannelTelegram: p},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	// No more connections for the role: its open ones are cut, so the
	// store's next call must connect, and is refused.
	if _, err := admin.Exec(ctx, "ALTER ROLE "+role+" CONNECTION LIMIT 0"); err != nil {
		t.Fatal(err)
	}
	terminate()
	const why = "too many connections for role"
	for end := time.Now().Add(30 * time.Second); !strings.Contains(logs.String(), why); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the worker's log never said why the database refused:\n%s", logs)
		}
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, why) && (!strings.Contains(line, `"msg":"store call failed"`) || !strings.Contains(line, `"reason":"pgstore: `)) {
			t.Errorf("the reason is not a store call's: %s", line)
		}
		if strings.Contains(line, rolePassword) {
			t.Errorf("a log line holds the DSN's password: %s", line)
		}
	}

	if _, err := admin.Exec(ctx, "ALTER ROLE "+role+" CONNECTION LIMIT -1"); err != nil {
		t.Fatal(err)
	}
	if _, err := rw.Enqueue(ctx, queuetest.Reply("r-after", "u-1", "hi")); err != nil {
		t.Fatal(err)
	}
	key := envelope.Key{Tenant: "default", EnvelopeID: "r-after"}
	for end := time.Now().Add(60 * time.Second); p.Delivered(key) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the worker did not deliver once the database accepted connections again")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

const rolePassword = "app-pw-5c1e"

// limitedRole makes a login role with privileges on schema's tables and
// the connection limit given (-1: none), and returns its name, a DSN that
// logs in as it and a function that ends its sessions.
func limitedRole(t *testing.T, schema string, limit int) (string, string, func()) {
	t.Helper()
	ctx := context.Background()
	role := schema + "_app"
	admin := pgtest.Admin()
	for _, q := range []string{
		"CREATE ROLE " + role + " LOGIN PASSWORD '" + rolePassword + "' CONNECTION LIMIT " + strconv.Itoa(limit),
		"GRANT USAGE ON SCHEMA " + schema + " TO " + role,
		"GRANT ALL ON ALL TABLES IN SCHEMA " + schema + " TO " + role,
		"GRANT ALL ON ALL SEQUENCES IN SCHEMA " + schema + " TO " + role,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	terminate := func() {
		if _, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		terminate()
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE "+role)
	})
	return role, withParam(t, withParam(t, pgtest.DSN(), "user", role), "password", rolePassword), terminate
}

// A LISTEN connection that cannot be made at all (here: the role may have
// one connection, which the pool holds) is logged as such, with the
// server's answer, not as a connection "lost".
func TestListen_NeverConnectedSaysSo(t *testing.T) {
	ctx := context.Background()
	schema := pgtest.Schema(t)
	rw, err := pgstore.Open(ctx, pgtest.DSN(), &pgstore.Options{Schema: schema, Options: queue.Options{Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	_, dsn, _ := limitedRole(t, schema, 1)
	logs := &syncBuffer{}
	s, err := pgstore.Open(ctx, withParam(t, dsn, "pool_max_conns", "1"), &pgstore.Options{Schema: schema, NoMigrate: true, Options: queue.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const want = "listen connection could not be made"
	for end := time.Now().Add(30 * time.Second); !strings.Contains(logs.String(), want); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %q in the store's log:\n%s", want, logs)
		}
	}
	if out := logs.String(); strings.Contains(out, "connection lost") || !strings.Contains(out, "too many connections for role") {
		t.Errorf("the log does not say the connection was never made, and why:\n%s", out)
	}
}
