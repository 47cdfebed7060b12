package resend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
)

func TestFileCursor(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fc := FileCursor(filepath.Join(dir, "resend.cursor"))
	if c, err := fc.LoadCursor(ctx); err != nil || c != "" {
		t.Fatalf("LoadCursor on a missing file = %q, %v; want empty", c, err)
	}
	for _, want := range []string{"4ef9a417-02e9-4d39-ad75-000000000001", "second", ""} {
		if err := fc.SaveCursor(ctx, want); err != nil {
			t.Fatalf("SaveCursor(%q): %v", want, err)
		}
		if got, err := fc.LoadCursor(ctx); err != nil || got != want {
			t.Fatalf("LoadCursor = %q, %v; want %q", got, err, want)
		}
	}
	if err := fc.SaveCursor(ctx, "a\nb"); err == nil {
		t.Errorf("SaveCursor accepted a line break")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "resend.cursor" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %v, want only resend.cursor (no temp files)", names)
	}
	missingDir := FileCursor(filepath.Join(dir, "nope", "c"))
	if err := missingDir.SaveCursor(ctx, "x"); err == nil {
		t.Errorf("SaveCursor into a missing directory succeeded")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := fc.SaveCursor(cctx, "x"); !errors.Is(err, context.Canceled) {
		t.Errorf("SaveCursor with a cancelled context = %v", err)
	}
}

func TestNewPoller_Errors(t *testing.T) {
	p := mustProvider(t, Options{APIKey: "re_x", From: "a@example.com"})
	s := &recordingSuppressor{}
	tests := []struct {
		name   string
		client *Provider
		sup    *recordingSuppressor
		opts   PollerOptions
		want   string
	}{
		{"no client", nil, s, PollerOptions{}, "client"},
		{"no suppressor", p, nil, PollerOptions{}, "suppressor"},
		{"negative interval", p, s, PollerOptions{Interval: -1}, "Interval"},
		{"page too large", p, s, PollerOptions{PageSize: 101}, "PageSize"},
		{"negative lookback", p, s, PollerOptions{Lookback: -1}, "Lookback"},
		{"negative max pages", p, s, PollerOptions{MaxPages: -1}, "MaxPages"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sup interface {
				SuppressEmail(context.Context, string, string, envelope.ErrorClass) error
			}
			if tt.sup != nil {
				sup = tt.sup
			}
			_, err := NewPoller(tt.client, sup, tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewPoller error = %v, want one naming %s", err, tt.want)
			}
		})
	}
}

// TestPoller_TwoPagesAndRestart walks two pages, fails on the second,
// and resumes from the persisted cursor in a new poller (a restart).
func TestPoller_TwoPagesAndRestart(t *testing.T) {
	ctx := context.Background()
	f := newFakeResend(t)
	now := time.Now()
	// Oldest first, so that the list (newest first) is e4, e3, e2, e1.
	f.addEmail("e1", "c@example.net", "bounced", now.Add(-4*time.Minute))
	f.addEmail("e2", "Bee <b@example.net>", "complained", now.Add(-3*time.Minute))
	f.addEmail("e3", "d@example.net", "delivered", now.Add(-2*time.Minute))
	f.addEmail("e4", "a@example.net", "bounced", now.Add(-1*time.Minute))
	f.failList("e3", 500) // the second page fails once

	cursorPath := filepath.Join(t.TempDir(), "resend.cursor")
	sup := &recordingSuppressor{}
	newPoller := func() *Poller {
		p := mustProvider(t, f.options(t, nil))
		pl, err := NewPoller(p, sup, PollerOptions{Tenant: "acme", Cursor: FileCursor(cursorPath), PageSize: 2})
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}

	first := newPoller()
	err := first.PollOnce(ctx)
	if err == nil {
		t.Fatal("PollOnce succeeded although the second page failed")
	}
	mustClass(t, err, envelope.KindRetryable, envelope.ClassProviderUnavailable)
	if got, want := sup.got(), []suppression{{"acme", "a@example.net", envelope.ClassBounced}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after page 1: suppressions %v, want %v", got, want)
	}
	if c, _ := FileCursor(cursorPath).LoadCursor(ctx); c != "e3" {
		t.Fatalf("persisted cursor = %q, want e3 (the last e-mail of page 1)", c)
	}

	// "Restart": a new provider and poller over the same cursor file.
	second := newPoller()
	if err := second.PollOnce(ctx); err != nil {
		t.Fatalf("PollOnce after restart: %v", err)
	}
	want := []suppression{
		{"acme", "a@example.net", envelope.ClassBounced},
		{"acme", "b@example.net", envelope.ClassComplaint},
		{"acme", "c@example.net", envelope.ClassBounced},
	}
	if got := sup.got(); !reflect.DeepEqual(got, want) {
		t.Fatalf("suppressions %v, want %v", got, want)
	}
	if got, want := f.lists(), []string{"", "e3", "e3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("list calls after= %q, want %q", got, want)
	}
	for _, l := range f.listLimit {
		if l != "2" {
			t.Errorf("list limit = %q, want 2", l)
		}
	}
	if c, _ := FileCursor(cursorPath).LoadCursor(ctx); c != "" {
		t.Errorf("cursor after a complete sweep = %q, want cleared", c)
	}

	// The next sweep starts from the newest e-mail again, and the poller
	// does not suppress what it already suppressed.
	if err := second.PollOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.lists(); got[len(got)-2] != "" {
		t.Errorf("the next sweep started at after=%q, want the top", got[len(got)-2])
	}
	if got := sup.got(); len(got) != len(want)+1 { // a@ again: the restarted poller never saw it
		t.Errorf("after a second sweep: %d suppressions, want %d", len(got), len(want)+1)
	}
	if err := second.PollOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sup.got(); len(got) != len(want)+1 {
		t.Errorf("a third sweep suppressed again: %d suppressions, want %d", len(got), len(want)+1)
	}
}

func TestPoller_DefaultPageSizeAndLookback(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	// 150 e-mails, one a minute, the newest a minute old: page 1 (100
	// e-mails) spans ages 1–100 min, page 2 ages 101–150 min.
	fill := func(f *fakeResend) {
		for i := range 150 {
			f.addEmail(fmt.Sprintf("m-%03d", i), "x@example.net", "delivered", now.Add(-time.Duration(150-i)*time.Minute))
		}
	}
	tests := []struct {
		name      string
		lookback  time.Duration
		wantPages int
	}{
		{"lookback beyond page 1", 140 * time.Minute, 2},
		{"lookback inside page 1", time.Hour, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeResend(t)
			fill(f)
			opts := f.options(t, nil)
			opts.Now = func() time.Time { return now }
			pl, err := NewPoller(mustProvider(t, opts), &recordingSuppressor{}, PollerOptions{Lookback: tt.lookback})
			if err != nil {
				t.Fatal(err)
			}
			if err := pl.PollOnce(ctx); err != nil {
				t.Fatal(err)
			}
			if got := len(f.lists()); got != tt.wantPages {
				t.Errorf("list calls = %d, want %d", got, tt.wantPages)
			}
			if f.listLimit[0] != "100" {
				t.Errorf("default limit = %q, want 100", f.listLimit[0])
			}
		})
	}
}

func TestPoller_MaxPages(t *testing.T) {
	f := newFakeResend(t)
	now := time.Now()
	for i := range 10 {
		f.addEmail(fmt.Sprintf("p-%d", i), "x@example.net", "delivered", now)
	}
	pl, err := NewPoller(mustProvider(t, f.options(t, nil)), &recordingSuppressor{}, PollerOptions{PageSize: 2, MaxPages: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := pl.PollOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := len(f.lists()); got != 3 {
		t.Errorf("list calls = %d, want MaxPages=3", got)
	}
}

func TestPoller_StaleCursorRestartsSweep(t *testing.T) {
	ctx := context.Background()
	f := newFakeResend(t)
	f.addEmail("e1", "a@example.net", "bounced", time.Now())
	cursorPath := filepath.Join(t.TempDir(), "c")
	if err := FileCursor(cursorPath).SaveCursor(ctx, "gone-id"); err != nil {
		t.Fatal(err)
	}
	sup := &recordingSuppressor{}
	pl, err := NewPoller(mustProvider(t, f.options(t, nil)), sup, PollerOptions{Cursor: FileCursor(cursorPath)})
	if err != nil {
		t.Fatal(err)
	}
	if err := pl.PollOnce(ctx); err != nil {
		t.Fatalf("PollOnce: %v", err)
	}
	if got, want := f.lists(), []string{"gone-id", ""}; !reflect.DeepEqual(got, want) {
		t.Errorf("list calls after= %q, want %q", got, want)
	}
	if got := sup.got(); len(got) != 1 || got[0].Tenant != envelope.DefaultTenant {
		t.Errorf("suppressions = %v, want one for the default tenant", got)
	}
}

func TestPoller_SuppressorErrorKeepsCursor(t *testing.T) {
	ctx := context.Background()
	f := newFakeResend(t)
	now := time.Now()
	f.addEmail("e1", "secret-rcpt@example.net", "bounced", now.Add(-2*time.Minute))
	f.addEmail("e2", "x@example.net", "delivered", now.Add(-time.Minute))
	cursorPath := filepath.Join(t.TempDir(), "c")
	sup := &recordingSuppressor{}
	sup.setErr(errors.New("store closed for secret-rcpt@example.net"))
	logger, logs := bufLogger()
	pl, err := NewPoller(mustProvider(t, f.options(t, logger)), sup, PollerOptions{Cursor: FileCursor(cursorPath), PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	err = pl.PollOnce(ctx)
	if err == nil {
		t.Fatal("PollOnce succeeded although the suppressor failed")
	}
	if strings.Contains(err.Error(), "secret-rcpt") || strings.Contains(logs.String(), "secret-rcpt") {
		t.Errorf("the recipient leaked: err %q, logs %q", err, logs.String())
	}
	if c, _ := FileCursor(cursorPath).LoadCursor(ctx); c != "e2" {
		t.Errorf("cursor = %q, want e2 (page 1 done, page 2 not)", c)
	}
	sup.setErr(nil)
	if err := pl.PollOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sup.got(); len(got) != 1 || got[0].Address != "secret-rcpt@example.net" {
		t.Errorf("suppressions after recovery = %v", got)
	}
}

func TestPoller_RunStopsOnCancel(t *testing.T) {
	f := newFakeResend(t)
	f.addEmail("e1", "a@example.net", "complained", time.Now())
	sup := &recordingSuppressor{notify: make(chan struct{}, 1)}
	pl, err := NewPoller(mustProvider(t, f.options(t, nil)), sup, PollerOptions{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pl.Run(ctx) }()
	select {
	case <-sup.notify:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not sweep at start")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if got := sup.got(); len(got) != 1 || got[0].Reason != envelope.ClassComplaint {
		t.Errorf("suppressions = %v", got)
	}
}

func TestParseCreatedAt(t *testing.T) {
	want := time.Date(2023, 4, 3, 22, 13, 42, 674981000, time.UTC)
	for _, s := range []string{
		"2023-04-03 22:13:42.674981+00",
		"2023-04-03T22:13:42.674981Z",
		"2023-04-03 22:13:42.674981+00:00",
		"2023-04-03T22:13:42.674981+00",
	} {
		got, ok := parseCreatedAt(s)
		if !ok || !got.Equal(want) {
			t.Errorf("parseCreatedAt(%q) = %v, %v", s, got, ok)
		}
	}
	if _, ok := parseCreatedAt("yesterday"); ok {
		t.Errorf("parseCreatedAt accepted garbage")
	}
}
