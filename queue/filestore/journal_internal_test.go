package filestore

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	bolt "go.etcd.io/bbolt"
)

// BeforeCommit sets the hook that runs in every write transaction after
// its ops and the journal's append, before the commit (for the children
// of the external tests).
func BeforeCommit(q *Queue, fn func() error) { q.setBeforeCommit(fn) }

func readJournal(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(JournalPath(dir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

var unsubscribed = queue.Suppression{Channel: envelope.ChannelEmail, Reason: envelope.ClassUnsubscribed}

func grant(t *testing.T, q *Queue, tenant, user string) {
	t.Helper()
	if err := q.SetConsent(context.Background(), tenant, user, queue.ConsentFlags{DigestEnabled: true, PushEnabled: true, EmailVerified: true}); err != nil {
		t.Fatal(err)
	}
}

// A torn last line (a writer killed in the middle of an append that was
// never acknowledged) is never applied; the next Open cuts it, and the
// journal goes on with complete lines that a rebuild reads.
func TestJournal_TornLastLine(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	grant(t, q, "", "u-1")
	q.Close()
	whole := readJournal(t, dir)
	torn := `{"op":"consent","tenant":"default","user":"u-2","consent":{"digest_enabled":tr`
	f, err := os.OpenFile(JournalPath(dir), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(torn)
	f.Close()
	if rep, err := Check(dir); err != nil || !rep.OK() || rep.Journal != 1 || rep.JournalUnapplied != 0 {
		t.Fatalf("Check with a torn line = %+v, %v; want 1 record, no problem", rep, err)
	}

	q = openFault(t, dir)
	if c, _ := q.Consent(context.Background(), "", "u-2"); c.DigestEnabled {
		t.Fatal("the torn line was applied")
	}
	if got := readJournal(t, dir); got != whole {
		t.Fatalf("journal after Open = %q, want the torn line cut: %q", got, whole)
	}
	grant(t, q, "", "u-3")
	q.Close()
	if rep, err := Check(dir); err != nil || !rep.OK() || rep.Journal != 2 {
		t.Fatalf("Check = %+v, %v", rep, err)
	}
	if _, err := Rebuild(dir, nil); err != nil {
		t.Fatal(err)
	}
	q = openFault(t, dir)
	for _, u := range []string{"u-1", "u-3"} {
		if c, _ := q.Consent(context.Background(), "", u); !c.DigestEnabled {
			t.Errorf("%s lost its consent in the rebuild", u)
		}
	}
}

// Erase leaves nothing of the user in the journal (its push endpoint, its
// keys, its id), keeps the other users' lines, and a rebuild afterwards
// does not bring the user back.
func TestJournal_EraseRemovesTheUsersLines(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	ctx := context.Background()
	const gone, kept = "https://push.example.net/wpush/erased-endpoint", "https://push.example.net/wpush/kept-endpoint"
	grant(t, q, "acme", "u-erased")
	grant(t, q, "acme", "u-kept")
	for u, ep := range map[string]string{"u-erased": gone, "u-kept": kept} {
		if err := q.SaveSubscription(ctx, "acme", u, envelope.PushSubscription{Endpoint: ep, Keys: envelope.PushKeys{P256dh: "p256dh-" + u, Auth: "auth-" + u}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Suppress(ctx, "acme", "u-erased", unsubscribed); err != nil {
		t.Fatal(err)
	}
	if err := q.SuppressEmail(ctx, "acme", "family@example.org", envelope.ClassBounced); err != nil {
		t.Fatal(err)
	}
	if j := readJournal(t, dir); !strings.Contains(j, gone) || !strings.Contains(j, "u-erased") {
		t.Fatalf("setup: the journal lacks the user's lines: %s", j)
	}
	if err := q.Erase(ctx, "acme", "u-erased"); err != nil {
		t.Fatal(err)
	}
	j := readJournal(t, dir)
	for _, s := range []string{gone, "u-erased", "auth-u-erased", "p256dh-u-erased"} {
		if strings.Contains(j, s) {
			t.Errorf("the journal still holds %q after Erase:\n%s", s, j)
		}
	}
	if !strings.Contains(j, kept) || !strings.Contains(j, "u-kept") || !strings.Contains(j, queue.TargetOfValue("email:family@example.org")) {
		t.Errorf("Erase took other facts from the journal:\n%s", j)
	}
	if strings.Contains(j, "family@example.org") {
		t.Errorf("the journal holds an address in clear:\n%s", j)
	}
	// The user signs up again: the new lines stay.
	grant(t, q, "acme", "u-erased")
	q.Close()
	if rep, err := Check(dir); err != nil || !rep.OK() {
		t.Fatalf("Check = %+v, %v", rep, err)
	}
	if _, err := Rebuild(dir, nil); err != nil {
		t.Fatal(err)
	}
	q = openFault(t, dir)
	c, _ := q.Consent(ctx, "acme", "u-erased")
	subs, _ := q.Subscriptions(ctx, "acme", "u-erased")
	if !c.DigestEnabled || len(c.Suppressions) != 0 || len(subs) != 0 {
		t.Fatalf("after erase, a new grant and a rebuild: consent %+v, subscriptions %+v; want only the new grant", c, subs)
	}
	if subs, _ := q.Subscriptions(ctx, "acme", "u-kept"); len(subs) != 1 {
		t.Fatalf("the other user's subscriptions after the rebuild: %+v", subs)
	}
}

// An erase whose rewrite did not happen (the process died after the
// erase committed) is finished by the next Open.
func TestJournal_EraseRewriteFinishedAtOpen(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	ctx := context.Background()
	const ep = "https://push.example.net/wpush/erased-endpoint"
	grant(t, q, "", "u-1")
	if err := q.SaveSubscription(ctx, "", "u-1", envelope.PushSubscription{Endpoint: ep, Keys: envelope.PushKeys{P256dh: "k", Auth: "a"}}); err != nil {
		t.Fatal(err)
	}
	// The erase's transaction only, as if the process died right after it.
	err := q.write(ctx, false, func(tx *bolt.Tx) error {
		return q.record(tx, jrec{Op: jErase, Tenant: envelope.DefaultTenant, User: "u-1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	q.Close()
	if !strings.Contains(readJournal(t, dir), ep) {
		t.Fatal("setup: the endpoint is not in the journal")
	}
	q = openFault(t, dir)
	if j := readJournal(t, dir); strings.Contains(j, ep) || strings.Contains(j, "u-1") {
		t.Fatalf("Open left the erased user's lines: %s", j)
	}
	if subs, _ := q.Subscriptions(ctx, "", "u-1"); len(subs) != 0 {
		t.Fatalf("subscriptions after the erase = %+v", subs)
	}
}

// A commit that fails after the journal's append takes the lines back:
// the change the caller was told failed does not come back in a rebuild.
func TestJournal_FailedCommitTakesItsLinesBack(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	grant(t, q, "", "u-1")
	before := readJournal(t, dir)
	q.setBeforeCommit(func() error { return errors.New("disk says no") })
	if err := q.Suppress(context.Background(), "", "u-1", unsubscribed); err == nil {
		t.Fatal("Suppress succeeded with a failing commit")
	}
	q.setBeforeCommit(nil)
	if got := readJournal(t, dir); got != before {
		t.Fatalf("journal after a failed commit = %q, want %q", got, before)
	}
	grant(t, q, "", "u-2")
	q.Close()
	if _, err := Rebuild(dir, nil); err != nil {
		t.Fatal(err)
	}
	q = openFault(t, dir)
	if c, _ := q.Consent(context.Background(), "", "u-1"); len(c.Suppressions) != 0 || !c.DigestEnabled {
		t.Fatalf("after the rebuild: %+v, want the failed unsubscribe absent", c)
	}
}

// A journal deleted while the store was closed, or an index written before
// the journal existed: doctor says so (a rebuild would lose the facts),
// and Open writes the journal from the index.
func TestJournal_MissingJournalWrittenFromIndex(t *testing.T) {
	for _, how := range []string{"deleted", "older index"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			q := openFault(t, dir)
			ctx := context.Background()
			grant(t, q, "", "u-1")
			if err := q.Suppress(ctx, "", "u-1", unsubscribed); err != nil {
				t.Fatal(err)
			}
			if err := q.SuppressEmail(ctx, "acme", "x@example.org", envelope.ClassComplaint); err != nil {
				t.Fatal(err)
			}
			if err := q.SaveSubscription(ctx, "", "u-1", envelope.PushSubscription{Endpoint: "https://push.example.net/e", Keys: envelope.PushKeys{P256dh: "k", Auth: "a"}}); err != nil {
				t.Fatal(err)
			}
			if how == "older index" {
				if err := q.db.Load().Update(func(tx *bolt.Tx) error { return tx.Bucket(bktMeta).Delete(keyJournal) }); err != nil {
					t.Fatal(err)
				}
			}
			q.Close()
			if err := os.Remove(JournalPath(dir)); err != nil {
				t.Fatal(err)
			}
			rep, err := Check(dir)
			if err != nil || rep.OK() || !strings.HasPrefix(rep.Problems[0], "journal ") || !strings.Contains(rep.Problems[0], "3 consent records") {
				t.Fatalf("Check = %+v, %v; want the missing journal reported", rep, err)
			}
			q = openFault(t, dir)
			q.Close()
			if rep, err := Check(dir); err != nil || !rep.OK() || rep.Journal != 3 {
				t.Fatalf("Check after Open = %+v, %v", rep, err)
			}
			if _, err := Rebuild(dir, nil); err != nil {
				t.Fatal(err)
			}
			q = openFault(t, dir)
			c, _ := q.Consent(ctx, "", "u-1")
			a, _ := q.AddressSuppressions(ctx, "acme")
			s, _ := q.Subscriptions(ctx, "", "u-1")
			if len(c.Suppressions) != 1 || len(a) != 1 || len(s) != 1 {
				t.Fatalf("after the rebuild: consent %+v, address suppressions %+v, subscriptions %+v", c, a, s)
			}
		})
	}
}

// A line that is no record (damaged in place) is reported by doctor and
// skipped by Open and Rebuild; the lines around it are applied.
func TestJournal_DamagedLineReported(t *testing.T) {
	dir := t.TempDir()
	q := openFault(t, dir)
	grant(t, q, "", "u-1")
	grant(t, q, "", "u-2")
	q.Close()
	b, _ := os.ReadFile(JournalPath(dir))
	b[0] = '#' // the first line's brace
	if err := os.WriteFile(JournalPath(dir), b, 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := Check(dir)
	if err != nil || len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], "offset 0 is no record") || rep.Journal != 1 {
		t.Fatalf("Check = %+v, %v", rep, err)
	}
	if _, err := Rebuild(dir, nil); err != nil {
		t.Fatal(err)
	}
	q = openFault(t, dir)
	if c, _ := q.Consent(context.Background(), "", "u-2"); !c.DigestEnabled {
		t.Fatal("the line after the damaged one was not applied")
	}
}

// A journal replaced by an older copy (a backup restored by hand) or cut
// short: its records never undo the index's newer ones; doctor says so,
// and Open writes the journal again from the index, which a rebuild then
// reads.
func TestJournal_ReplacedByAnOlderCopy(t *testing.T) {
	for _, how := range []string{"older copy", "cut"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			q := openFault(t, dir)
			grant(t, q, "", "u-1")
			old := readJournal(t, dir)
			if err := q.Suppress(context.Background(), "", "u-1", unsubscribed); err != nil {
				t.Fatal(err)
			}
			q.Close()
			if how == "cut" {
				if err := os.Truncate(JournalPath(dir), int64(len(old))); err != nil {
					t.Fatal(err)
				}
			} else {
				tmp := JournalPath(dir) + ".restored"
				if err := os.WriteFile(tmp, []byte(old), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, JournalPath(dir)); err != nil {
					t.Fatal(err)
				}
			}
			rep, err := Check(dir)
			if err != nil || rep.OK() || !strings.HasPrefix(rep.Problems[0], "journal ") || !strings.Contains(rep.Problems[0], "writes it again from the index") {
				t.Fatalf("Check = %+v, %v; want the journal reported", rep, err)
			}
			want := func(q *Queue, when string) {
				t.Helper()
				if c, _ := q.Consent(context.Background(), "", "u-1"); len(c.Suppressions) != 1 {
					t.Fatalf("consent %s = %+v, want still unsubscribed", when, c)
				}
			}
			q = openFault(t, dir)
			want(q, "after Open")
			q.Close()
			if rep, err := Check(dir); err != nil || !rep.OK() {
				t.Fatalf("Check after Open = %+v, %v", rep, err)
			}
			if _, err := Rebuild(dir, nil); err != nil {
				t.Fatal(err)
			}
			want(openFault(t, dir), "after a rebuild")
		})
	}
}

// The journal removed, replaced by an older copy, or cut, under the running
// store, then a consent change: the journal is written again from the
// index (with the change), not appended to as a file without the facts
// before it, so that a rebuild from the logs and the journal keeps every
// user's consent.
func TestJournal_RemovedUnderTheRunningStore(t *testing.T) {
	for _, how := range []string{"removed", "older copy", "cut"} {
		t.Run(how, func(t *testing.T) {
			dir := t.TempDir()
			q := openFault(t, dir)
			grant(t, q, "", "u-1")
			old := readJournal(t, dir)
			if err := q.Suppress(context.Background(), "", "u-1", unsubscribed); err != nil {
				t.Fatal(err)
			}
			var err error
			switch how {
			case "removed":
				err = os.Remove(JournalPath(dir))
			case "cut":
				err = os.Truncate(JournalPath(dir), int64(len(old)))
			default:
				tmp := JournalPath(dir) + ".restored"
				if err = os.WriteFile(tmp, []byte(old), 0o600); err == nil {
					err = os.Rename(tmp, JournalPath(dir))
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			grant(t, q, "", "u-2")
			q.Close()
			if rep, err := Check(dir); err != nil || !rep.OK() {
				t.Fatalf("Check after the next consent change = %+v, %v", rep, err)
			}
			if _, err := Rebuild(dir, nil); err != nil {
				t.Fatal(err)
			}
			q = openFault(t, dir)
			if c, _ := q.Consent(context.Background(), "", "u-1"); !c.DigestEnabled || len(c.Suppressions) != 1 {
				t.Fatalf("u-1's consent after a rebuild = %+v, want granted and unsubscribed", c)
			}
			if c, _ := q.Consent(context.Background(), "", "u-2"); !c.DigestEnabled {
				t.Fatalf("u-2's consent after a rebuild = %+v, want granted", c)
			}
		})
	}
}
