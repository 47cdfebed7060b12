package main

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// The demo's envelopes: copies of testdata/delivery/*.golden.json (a test
// keeps them identical), embedded so that an installed binary can run the
// demo anywhere.
//
//go:embed demodata/*.json
var demoData embed.FS

var demoFiles = []string{"your-week-digest.v1.golden.json", "resurface-nudge.v1.golden.json", "reply-text.v1.golden.json"}

func init() {
	register(&command{Name: "demo", Short: "run the whole delivery loop once on ./data with the sink provider (no credentials)", Run: runDemo})
}

func runDemo(ctx context.Context, e *env, args []string) int {
	s := newSettings("demo", e)
	s.usage("Usage: outbox demo [--data DIR]\n\nOpens a store in --data, grants consent to the demo users, enqueues the golden\ndigest e-mail, the push nudge and a 3-segment chat reply, delivers them through\nthe sink provider (files under DATA/sink) and prints what happened. Run twice,\nit reports duplicates and sends nothing new. Needs no credentials.\n\nFlags:\n")
	data := dataFlag(s)
	verbose := s.fs.Bool("v", false, "show the store's and the worker's logs")
	if code, done := s.parse(args); done {
		return code
	}
	if err := os.MkdirAll(*data, 0o700); err != nil {
		return fail(e, "%v", err)
	}
	var logOut io.Writer = io.Discard
	if *verbose {
		logOut = e.Stderr
	}
	log := slog.New(slog.NewTextHandler(logOut, nil))
	// The demo ignores provider credentials in the environment: everything
	// goes to the sink.
	noEnv := &env{Stdin: e.Stdin, Stdout: e.Stdout, Stderr: e.Stderr, Getenv: func(string) string { return "" }}
	a, err := buildApp(noEnv, appConfig{
		Data: *data, PublicURL: "http://127.0.0.1:8080", Concurrency: 4, Lease: 30 * time.Second,
		Backoff: queue.Backoff{Base: 200 * time.Millisecond, Cap: time.Second}, Shutdown: 5 * time.Second, Logger: log,
	})
	if err != nil {
		return fail(e, "%v", err)
	}
	defer a.close()

	envs, err := demoEnvelopes(time.Now())
	if err != nil {
		return fail(e, "%v", err)
	}
	for _, env := range envs {
		if err := a.q.SetConsent(ctx, env.TenantID, env.UserID, queue.ConsentFlags{DigestEnabled: true, PushEnabled: true, EmailVerified: true, Cadence: "weekly"}); err != nil {
			return fail(e, "consent: %v", err)
		}
	}
	fmt.Fprintf(e.Stdout, "store: %s (consent granted to %d demo users)\n", *data, len(envs))
	res, err := a.q.Enqueue(ctx, envs...)
	if err != nil {
		return fail(e, "enqueue: %v", err)
	}
	fresh := 0
	for _, r := range res {
		verb := "queued   "
		if r.Duplicate {
			verb = "duplicate"
		} else {
			fresh++
		}
		fmt.Fprintf(e.Stdout, "%s %s/%s (%d segment(s))\n", verb, r.Tenant, r.ID, r.Segments)
	}

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.w.Run(runCtx) }()
	settled := func() bool {
		for _, env := range envs {
			st, err := a.q.Get(ctx, env.TenantID, env.ID)
			if err != nil {
				return false
			}
			for _, seg := range st.Segments {
				if !seg.State.Terminal() && seg.State != envelope.StateUnresolved {
					return false
				}
			}
		}
		return true
	}
	deadline := time.After(30 * time.Second)
	for !settled() {
		select {
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			stop()
			<-done
			return fail(e, "deliveries did not settle within 30s (run with -v to see the worker's logs)")
		case <-ctx.Done():
			stop()
			<-done
			return exitFailure
		}
	}
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return fail(e, "worker: %v", err)
	}

	fmt.Fprintln(e.Stdout)
	tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ENVELOPE\tCHANNEL\tSTATE\tRENDERED MESSAGE")
	for _, env := range envs {
		st, err := a.q.Get(ctx, env.TenantID, env.ID)
		if err != nil {
			return fail(e, "%v", err)
		}
		sk := a.sinks[env.Channel]
		for i, seg := range st.Segments {
			where := "-"
			if sk != nil {
				where = sk.Path(envelope.Key{Tenant: env.TenantID, EnvelopeID: env.ID, Segment: seg.Index})
				if rel, err := filepath.Rel(".", where); err == nil {
					where = rel
				}
			}
			name, state := env.ID, string(seg.State)
			if len(st.Segments) > 1 {
				name = fmt.Sprintf("%s #%d", env.ID, i)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, env.Channel, state, where)
		}
	}
	tw.Flush()
	if fresh == 0 {
		fmt.Fprintln(e.Stdout, "\nnothing new was sent: every envelope was a duplicate (delete the data directory to start over)")
	} else {
		fmt.Fprintf(e.Stdout, "\n%d envelope(s) delivered to the sink. Open the .eml in a mail client; \"go run ./cmd/outbox ls --data %s\" lists the rows, \"go run ./cmd/outbox console --data %s\" shows them in a browser.\n", fresh, *data, *data)
	}
	return exitOK
}

// demoEnvelopes loads the embedded golden fixtures with their times moved
// to now (the fixtures' dates are fixed; an expired envelope is never sent).
func demoEnvelopes(now time.Time) ([]*envelope.Envelope, error) {
	var out []*envelope.Envelope
	for _, f := range demoFiles {
		b, err := demoData.ReadFile("demodata/" + f)
		if err != nil {
			return nil, err
		}
		env, err := envelope.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("demo fixture %s: %w", f, err)
		}
		if env.TenantID == "" {
			env.TenantID = envelope.DefaultTenant
		}
		now = now.UTC().Truncate(time.Second)
		env.CreatedAt = now
		env.NotBefore = now.Add(-time.Minute)
		env.ExpiresAt = now.Add(7 * 24 * time.Hour)
		out = append(out, env)
	}
	return out, nil
}
