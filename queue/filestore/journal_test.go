package filestore_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/filestore/internal/applog"
	"github.com/outboxhq/outbox/queue/queuetest"
)

// facts is every consent fact of some users, as the store answers.
type facts struct {
	Consent map[string]queue.Consent
	Subs    map[string][]queue.Subscription
	AddrSup map[string][]queue.Suppression
}

var factUsers = [][2]string{{"", "u-1"}, {"", "u-2"}, {"acme", "u-1"}, {"acme", "u-3"}}

func factsOf(t *testing.T, q *filestore.Queue) facts {
	t.Helper()
	ctx := context.Background()
	f := facts{map[string]queue.Consent{}, map[string][]queue.Subscription{}, map[string][]queue.Suppression{}}
	for _, tu := range factUsers {
		c, err := q.Consent(ctx, tu[0], tu[1])
		if err != nil {
			t.Fatal(err)
		}
		f.Consent[tu[0]+"/"+tu[1]] = c
		s, err := q.Subscriptions(ctx, tu[0], tu[1])
		if err != nil {
			t.Fatal(err)
		}
		f.Subs[tu[0]+"/"+tu[1]] = s
	}
	for _, tenant := range []string{"", "acme"} {
		a, err := q.AddressSuppressions(ctx, tenant)
		if err != nil {
			t.Fatal(err)
		}
		f.AddrSup[tenant] = a
	}
	return f
}

func sub(endpoint string) envelope.PushSubscription {
	return envelope.PushSubscription{Endpoint: endpoint, Keys: envelope.PushKeys{P256dh: "BPk-p256dh-key", Auth: "auth-secret"}}
}

// makeFacts writes every kind of fact through the store: consent flags,
// a user's unsubscribe, subscriptions saved, replaced and deleted, a
// resubscription lifting a suppression, address suppressions added and
// lifted, and the suppressions a committed e-mail bounce writes.
func makeFacts(t *testing.T, q *filestore.Queue, clock *queuetest.Clock) {
	t.Helper()
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, tu := range factUsers {
		queuetest.GrantAll(t, q, tu[0], tu[1])
		clock.Advance(time.Second)
	}
	must(q.SetConsent(ctx, "acme", "u-3", queue.ConsentFlags{PushEnabled: true, Cadence: "daily"}))
	must(q.Suppress(ctx, "", "u-2", queue.Suppression{Channel: envelope.ChannelEmail, Reason: envelope.ClassUnsubscribed}))
	must(q.SaveSubscription(ctx, "", "u-1", sub(queuetest.EndpointOf("u-1"))))
	must(q.SaveSubscription(ctx, "", "u-1", sub(queuetest.EndpointOf("u-1")+"/b")))
	must(q.SaveSubscription(ctx, "acme", "u-3", sub(queuetest.EndpointOf("u-3"))))
	must(q.DeleteSubscription(ctx, "", "u-1", queuetest.EndpointOf("u-1")+"/b"))
	clock.Advance(time.Minute)
	// A gone subscription, then the browser subscribes again: lifted.
	must(q.Suppress(ctx, "acme", "u-1", queue.Suppression{Channel: envelope.ChannelPush, Target: queue.TargetOfValue("push:" + queuetest.EndpointOf("u-1")), Reason: envelope.ClassSubscriptionGone}))
	must(q.SaveSubscription(ctx, "acme", "u-1", sub(queuetest.EndpointOf("u-1"))))
	must(q.SuppressEmail(ctx, "", "shared@example.org", envelope.ClassComplaint))
	must(q.SuppressEmail(ctx, "acme", "lifted@example.org", envelope.ClassBounced))
	must(q.LiftAddressSuppression(ctx, "acme", queue.TargetOfValue("email:lifted@example.org")))
	// A bounce committed by a worker: the user's and the tenant's
	// suppressions, written in the commit's transaction.
	if _, err := q.Enqueue(ctx, queuetest.Digest("d-1", "u-1")); err != nil {
		t.Fatal(err)
	}
	ls, err := q.Claim(ctx, queue.ClaimRequest{Owner: "w", Lease: time.Minute, Limit: 1})
	if err != nil || len(ls) != 1 {
		t.Fatalf("claim: %v %v", ls, err)
	}
	must(q.Commit(ctx, ls[0], queue.Outcome{State: envelope.StateBounced, Class: envelope.ClassBounced}))
}

func openClocked(t *testing.T, dir string, clock *queuetest.Clock) *filestore.Queue {
	t.Helper()
	return mustOpen(t, dir, &filestore.Options{Options: queue.Options{Now: clock.Now}, DisableWatcher: true, RescanInterval: -1})
}

// A rebuild from the logs and the consent journal keeps every fact the
// index held: consent flags and suppressions, subscriptions and address
// suppressions, deletions and lifts included.
func TestJournal_RebuildKeepsEveryFact(t *testing.T) {
	dir := t.TempDir()
	clock := queuetest.NewClock(queuetest.T0)
	q := openClocked(t, dir, clock)
	makeFacts(t, q, clock)
	before := factsOf(t, q)
	if len(before.Consent["/u-1"].Suppressions) == 0 || len(before.AddrSup[""]) != 2 || len(before.Subs["/u-1"]) != 1 {
		t.Fatalf("setup: %+v", before)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := filestore.Rebuild(dir, nil); err != nil {
		t.Fatal(err)
	}
	q = openClocked(t, dir, clock)
	if after := factsOf(t, q); !reflect.DeepEqual(after, before) {
		t.Fatalf("after a rebuild:\n%+v\nwant\n%+v", after, before)
	}
	// The unsubscribed user stays suppressed, the bounced address too.
	for _, e := range []*envelope.Envelope{queuetest.Digest("d-2", "u-2"), queuetest.Digest("d-3", "u-1")} {
		if _, err := q.Enqueue(context.Background(), e); err == nil || !strings.Contains(err.Error(), "consent") {
			t.Errorf("Enqueue %s after the rebuild = %v, want refused by consent", e.ID, err)
		}
	}
	if rep, err := q.Check(); err != nil || !rep.OK() || rep.Journal == 0 {
		t.Fatalf("Check after the rebuild = %+v, %v", rep, err)
	}
}

// Killed between the journal's append and the index's commit (the
// unsubscribe was never acknowledged, but it is durable): doctor sees the
// unapplied bytes, Open applies them, and a rebuild keeps them.
func TestJournal_CrashBetweenAppendAndCommit(t *testing.T) {
	dir := t.TempDir()
	cmd := child(t, "journal-crash", dir, "")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "appended\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child: %q %v", line, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	rep, err := filestore.Check(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.JournalUnapplied == 0 || rep.Journal != 2 {
		t.Fatalf("Check after the crash = %+v, want 2 journal records and unapplied bytes, no problem", rep)
	}
	check := func(q *filestore.Queue, when string) {
		t.Helper()
		c, err := q.Consent(context.Background(), "", "u-1")
		if err != nil || len(c.Suppressions) != 1 || c.Suppressions[0].Reason != envelope.ClassUnsubscribed || !c.DigestEnabled {
			t.Fatalf("consent %s = %+v, %v; want granted and unsubscribed", when, c, err)
		}
	}
	q := mustOpen(t, dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
	check(q, "after the restart")
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if rep, err := filestore.Check(dir); err != nil || !rep.OK() || rep.JournalUnapplied != 0 {
		t.Fatalf("Check after the restart = %+v, %v", rep, err)
	}
	if _, err := filestore.Rebuild(dir, nil); err != nil {
		t.Fatal(err)
	}
	q = mustOpen(t, dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
	check(q, "after a rebuild")
}

// journalCrash is the child of TestJournal_CrashBetweenAppendAndCommit:
// it grants consent, then unsubscribes and waits to be killed once the
// unsubscribe is in the journal and before the index commits it.
func journalCrash(dir string) int {
	q, err := filestore.Open(dir, &filestore.Options{DisableWatcher: true, RescanInterval: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := q.SetConsent(context.Background(), "", "u-1", queue.ConsentFlags{DigestEnabled: true, EmailVerified: true}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	filestore.BeforeCommit(q, func() error {
		fmt.Println("appended")
		select {} // killed here
	})
	_ = q.Suppress(context.Background(), "", "u-1", queue.Suppression{Channel: envelope.ChannelEmail, Reason: envelope.ClassUnsubscribed})
	return 1
}

// A rebuilt row's enqueue time is its envelope's created_at (a log line
// does not record when it was enqueued), never later than the rebuild:
// before, every rebuilt row looked enqueued at the rebuild.
func TestRebuild_EnqueuedAtIsTheEnvelopesCreation(t *testing.T) {
	dir := t.TempDir()
	clock := queuetest.NewClock(queuetest.T0)
	q := openClocked(t, dir, clock)
	old := queuetest.Reply("r-old", "u-1", "hi")
	old.CreatedAt = queuetest.T0.Add(-time.Hour)
	ahead := queuetest.Reply("r-ahead", "u-1", "hi") // a producer's clock ahead of the rebuild's
	ahead.CreatedAt = queuetest.T0.Add(48 * time.Hour)
	if _, err := q.Enqueue(context.Background(), old, ahead); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	clock.Advance(24 * time.Hour)
	rebuiltAt := clock.Now()
	if _, err := filestore.Rebuild(dir, &filestore.Options{Options: queue.Options{Now: clock.Now}}); err != nil {
		t.Fatal(err)
	}
	q = openClocked(t, dir, clock)
	defer q.Close()
	for id, want := range map[string]time.Time{"r-old": old.CreatedAt, "r-ahead": rebuiltAt} {
		st, err := q.Get(context.Background(), "", id)
		if err != nil {
			t.Fatal(err)
		}
		if !st.EnqueuedAt.Equal(want) {
			t.Errorf("%s after the rebuild: enqueued_at %v, want %v", id, st.EnqueuedAt, want)
		}
	}
}

// A line appended while no store had the directory open is indexed at the
// next Open with its envelope's created_at as its enqueue time (clamped to
// the Open's time), as a rebuild does: the Open's time would make it look
// fresh, and its delivery quick. A line appended under a running store
// keeps the time it was ingested.
func TestOpen_ALineAppendedWhileClosedIsEnqueuedAtItsCreation(t *testing.T) {
	dir := t.TempDir()
	clock := queuetest.NewClock(queuetest.T0)
	q := openClocked(t, dir, clock)
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	appendForeign := func(e *envelope.Envelope) {
		t.Helper()
		e.TenantID = envelope.DefaultTenant
		line, err := envelope.ValidEncoding(e)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := applog.AppendLocked(filestore.LogPath(dir, e.TenantID, e.UserID), append(line, '\n'), nil); err != nil {
			t.Fatal(err)
		}
	}
	old := queuetest.Reply("r-old", "u-1", "hi")
	old.CreatedAt = queuetest.T0.Add(-time.Hour)
	ahead := queuetest.Reply("r-ahead", "u-1", "hi") // a producer's clock ahead of the Open's
	ahead.CreatedAt = queuetest.T0.Add(48 * time.Hour)
	appendForeign(old)
	appendForeign(ahead)
	clock.Advance(24 * time.Hour)
	openedAt := clock.Now()
	q = mustOpen(t, dir, &filestore.Options{Options: queue.Options{Now: clock.Now}, RescanInterval: -1})
	defer q.Close()

	clock.Advance(time.Hour)
	live := queuetest.Reply("r-live", "u-2", "hi")
	live.CreatedAt = queuetest.T0.Add(-time.Hour)
	appendForeign(live)
	q.Rescan()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := q.Get(context.Background(), "", "r-live"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the line appended under the running store was not ingested")
		}
		time.Sleep(time.Millisecond)
	}
	for id, want := range map[string]time.Time{"r-old": old.CreatedAt, "r-ahead": openedAt, "r-live": clock.Now()} {
		st, err := q.Get(context.Background(), "", id)
		if err != nil {
			t.Fatal(err)
		}
		if !st.EnqueuedAt.Equal(want) {
			t.Errorf("%s: enqueued_at %v, want %v", id, st.EnqueuedAt, want)
		}
	}
}
