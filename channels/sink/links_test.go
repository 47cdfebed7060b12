package sink_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/channels"
	"github.com/outboxhq/outbox/channels/sink"
	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/internal/nofollow"
)

// No symbolic link inside the data directory is followed (issue K, item
// 9): the sink directory, a channel's directory, a message's file and the
// journal, each planted as a link to something outside the data
// directory, make Deliver fail with an error that names the link
// (relative to the data directory), and nothing is written through it.
func TestSink_NeverFollowsLinks(t *testing.T) {
	k := key("env-link", 0)
	for _, tc := range []struct {
		name string
		link string // relative to the data directory
		dir  bool   // the target is a directory
	}{
		{"sink directory", "sink", true},
		{"channel directory", "sink/telegram", true},
		{"message file", "sink/telegram/" + k.Hash() + ".json", false},
		{"journal", "sink/telegram.journal", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, outside := t.TempDir(), t.TempDir()
			target := outside
			if !tc.dir {
				target = filepath.Join(outside, "victim")
				if err := os.WriteFile(target, []byte("untouched\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			link := filepath.Join(data, filepath.FromSlash(tc.link))
			if err := os.MkdirAll(filepath.Dir(link), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			p, err := sink.New(data, envelope.ChannelTelegram, &sink.Options{Journal: true})
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Deliver(context.Background(), k, chatMessage(0))
			var de *envelope.DeliveryError
			if !errors.As(err, &de) || de.Class != envelope.ClassProviderUnavailable || de.Kind != envelope.KindRetryable {
				t.Fatalf("Deliver through a linked %s: %v, want a retryable provider_unavailable", tc.link, err)
			}
			if !errors.Is(err, nofollow.ErrSymlink) || !strings.Contains(de.Err.Error(), filepath.FromSlash(tc.link)+" in the data directory is a symbolic link") {
				t.Fatalf("Deliver through a linked %s: cause %v", tc.link, de.Err)
			}
			if strings.Contains(de.Err.Error(), data) || strings.Contains(de.Err.Error(), outside) {
				t.Errorf("the cause names absolute paths: %v", de.Err)
			}
			if tc.dir {
				if err := p.CheckDir(); !errors.Is(err, nofollow.ErrSymlink) || !strings.Contains(err.Error(), filepath.FromSlash(tc.link)) {
					t.Errorf("CheckDir: %v", err)
				}
			}
			entries, _ := os.ReadDir(outside)
			if tc.dir && len(entries) != 0 {
				t.Errorf("written through the link: %v", entries)
			}
			if !tc.dir {
				if b, _ := os.ReadFile(target); string(b) != "untouched\n" {
					t.Errorf("written through the link: %q", b)
				}
			}
			if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
				t.Errorf("the link was replaced: %v, %v", fi, err)
			}
		})
	}
}

// Reconcile never takes a link for a delivered message.
func TestSink_ReconcileRefusesLinks(t *testing.T) {
	data, outside := t.TempDir(), t.TempDir()
	k := key("env-rec", 0)
	p := newSink(t, data, envelope.ChannelTelegram)
	deliver(t, p, key("other", 0), chatMessage(0)) // creates the directories
	target := filepath.Join(outside, "x.json")
	if err := os.WriteFile(target, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p.Path(k)); err != nil {
		t.Fatal(err)
	}
	r, err := p.Reconcile(context.Background(), k, chatMessage(0))
	if err == nil || r.Outcome == channels.Accepted {
		t.Fatalf("Reconcile of a linked message file: %+v, %v", r, err)
	}
	// A linked channel directory: not followed either.
	data2 := t.TempDir()
	if err := os.MkdirAll(filepath.Join(data2, "sink"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(p.Path(k)), filepath.Join(data2, "sink", "telegram")); err != nil {
		t.Fatal(err)
	}
	p2 := newSink(t, data2, envelope.ChannelTelegram)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := p2.Reconcile(ctx, key("other", 0), chatMessage(0)); !errors.Is(err, nofollow.ErrSymlink) || r.Outcome == channels.Accepted {
		t.Fatalf("Reconcile through a linked channel directory: %+v, %v", r, err)
	}
}
