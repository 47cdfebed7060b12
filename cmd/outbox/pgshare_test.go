package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/pgstore/pgtest"
)

// Two serves on one database share the queue: a load posted to both
// (chat envelopes of one to four segments over many users), one of them
// SIGKILLed while it holds leases, the other running on. From the
// provider's side (the sink, in one data directory for both: one provider
// that both processes call, whose Reconcile sees what either delivered)
// every acknowledged segment is delivered once, each envelope's segments in
// order; the killed process's leases are recovered by the survivor (each
// ends with a newer fence than the one it had at the kill).
func TestPG_TwoServesShareTheQueue(t *testing.T) {
	bin := buildBinary(t)
	schema := pgtest.Schema(t)
	env := pgEnv(schema)
	if out, code := outboxEnv(t, bin, env, "migrate"); code != 0 {
		t.Fatalf("migrate = %d %s", code, out)
	}
	data := t.TempDir()
	const token = "share-token-0123456789abcdef"
	args := []string{"--no-migrate", "--lease", "2s", "--sink-journal", "--concurrency", "4", "--shutdown-timeout", "3s"}
	start := func() *daemon {
		d, out, _ := launchServe(t, bin, data, append(env, "INTERNAL_OUTBOX_TOKEN="+token), args...)
		if d == nil {
			t.Fatalf("serve:\n%s", out)
		}
		return d
	}
	a := start() // first: it creates the unsubscribe key both use
	b := start()

	type ack struct{ segs int }
	var (
		mu    sync.Mutex
		acked = map[string]ack{}
	)
	client := &http.Client{Timeout: 5 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	post := func(base, id, user string, segs int) {
		req, _ := http.NewRequest("POST", base+"/v1/envelopes", bytes.NewReader(chatJSON(id, user, segs)))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return // cut by the kill: not acknowledged
		}
		defer resp.Body.Close()
		var r struct {
			Results []queue.EnqueueResult `json:"results"`
		}
		if resp.StatusCode == http.StatusCreated && json.NewDecoder(resp.Body).Decode(&r) == nil && len(r.Results) == 1 {
			mu.Lock()
			acked[id] = ack{segs: r.Results[0].Segments}
			mu.Unlock()
		}
	}
	// The first half to both, alternately; the second half, after the
	// kill, to the survivor.
	const n = 300
	var wg, half, aDead sync.WaitGroup
	half.Add(4)
	aDead.Add(1)
	for p := range 4 {
		wg.Go(func() {
			for i := p; i < n; i += 4 {
				base := b.base
				if i < n/2 && i%2 == 0 {
					base = a.base
				}
				if i >= n/2 && i-4 < n/2 {
					half.Done()
					aDead.Wait()
				}
				post(base, fmt.Sprintf("s-%03d", i), "u"+strconv.Itoa(i%20), 1+i%4)
			}
		})
	}
	half.Wait()

	// Kill a while both processes hold leases.
	ctx := context.Background()
	sendingBy := func() map[string]map[rowID]uint64 {
		rows, err := pgtest.Admin().Query(ctx, `SELECT env_id, seg, owner, fence FROM `+pgx.Identifier{schema}.Sanitize()+`.deliveries WHERE state = 'sending'`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]map[rowID]uint64{}
		for rows.Next() {
			var r rowID
			var owner string
			var fence int64
			if err := rows.Scan(&r.id, &r.seg, &owner, &fence); err != nil {
				t.Fatal(err)
			}
			if out[owner] == nil {
				out[owner] = map[rowID]uint64{}
			}
			out[owner][r] = uint64(fence)
		}
		return out
	}
	eventually(t, "both serves delivering", func() bool {
		busy := 0
		for _, leases := range sendingBy() {
			if len(leases) >= 2 {
				busy++
			}
		}
		return busy >= 2
	})
	a.kill()
	atKill := sendingBy() // a's leases among them stay as they are until recovered
	aDead.Done()
	// The survivor's owner: whoever leases a row after the kill.
	var maxAtKill uint64
	for _, leases := range atKill {
		for _, f := range leases {
			maxAtKill = max(maxAtKill, f)
		}
	}
	survivor := ""
	eventually(t, "a lease taken after the kill", func() bool {
		for owner, leases := range sendingBy() {
			for _, f := range leases {
				if f > maxAtKill {
					survivor = owner
					return true
				}
			}
		}
		return false
	})
	wg.Wait()

	settled := func() bool {
		out, code := outboxEnv(t, bin, env, "stats", "--json")
		var c queue.Counts
		return code == 0 && json.Unmarshal([]byte(out), &c) == nil &&
			c.Total(envelope.StatePending)+c.Total(envelope.StateSending)+c.Total(envelope.StateRetryable) == 0
	}
	eventually(t, "every row settled", settled)
	_, metrics := request(t, "GET", b.base+"/metrics", "", nil)
	b.stop(t)

	// The journal: one line per Deliver call of either process, in the
	// order they were made (O_APPEND, one write each).
	f, err := os.Open(filepath.Join(data, "sink", "telegram.journal"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	calls := map[string][]int{} // key hash: line numbers
	sc := bufio.NewScanner(f)
	for line := 0; sc.Scan(); line++ {
		calls[sc.Text()] = append(calls[sc.Text()], line)
	}
	segments, twice, missing, disorder := 0, 0, 0, 0
	for id, ak := range acked {
		prev := -1
		for seg := range ak.segs {
			segments++
			h := envelope.Key{Tenant: envelope.DefaultTenant, EnvelopeID: id, Segment: seg}.Hash()
			if _, err := os.Stat(filepath.Join(data, "sink", "telegram", h+".json")); err != nil {
				missing++
				t.Errorf("%s segment %d was never delivered", id, seg)
			}
			switch at := calls[h]; len(at) {
			case 0: // delivered, then killed before its journal line: the survivor's Reconcile found it
			case 1:
				if at[0] < prev {
					disorder++
					t.Errorf("%s segment %d delivered before segment %d", id, seg, seg-1)
				}
				prev = at[0]
			default:
				twice++
				t.Errorf("%s segment %d delivered %d times", id, seg, len(at))
			}
		}
	}
	// a's leases at the kill: the survivor leased each again (a newer
	// fence), unless a's commit of it was already on its way to the server.
	ends := map[rowID]uint64{}
	rows, err := pgtest.Admin().Query(ctx, `SELECT env_id, seg, fence, state FROM `+pgx.Identifier{schema}.Sanitize()+`.deliveries`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var r rowID
		var fence int64
		var state string
		if err := rows.Scan(&r.id, &r.seg, &fence, &state); err != nil {
			t.Fatal(err)
		}
		if state != string(envelope.StateSent) {
			t.Errorf("%s segment %d ended %s", r.id, r.seg, state)
		}
		ends[r] = uint64(fence)
	}
	rows.Close()
	recovered, committed := 0, 0
	for owner, leases := range atKill {
		if owner == survivor {
			continue
		}
		for r, fence := range leases {
			if ends[r] > fence {
				recovered++
			} else {
				committed++ // a's commit reached the server before the kill took a's connection
			}
		}
	}
	if recovered == 0 {
		t.Errorf("no lease of the killed serve was recovered by the survivor (owners sending at the kill: %d)", len(atKill))
	}
	if !strings.Contains(string(metrics), "outbox_lease_recoveries_total") {
		t.Errorf("the survivor's metrics count no lease recoveries")
	}
	t.Logf("two serves: acknowledged=%d segments=%d deliver_calls=%d killed_leases_recovered=%d killed_commits_landed=%d twice=%d missing=%d out_of_order=%d",
		len(acked), segments, len(calls), recovered, committed, twice, missing, disorder)
	if len(acked) < n/2 {
		t.Errorf("only %d of %d envelopes acknowledged", len(acked), n)
	}
}

type rowID struct {
	id  string
	seg int
}
