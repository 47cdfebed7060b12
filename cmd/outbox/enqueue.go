package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
	"github.com/outboxhq/outbox/queue/httpapi"
)

func init() {
	register(&command{Name: "enqueue", Short: "append envelopes to their users' logs (no daemon needed)", Run: runEnqueue})
}

const enqueueHelp = `Usage: outbox enqueue [--data DIR] [--json] FILE...|-

Appends envelopes (a file holds one envelope, a JSON array or JSON Lines; -
reads stdin) to their users' append logs in --data, each log under its
exclusive lock with an fsync, without opening the store: a running outbox
serve picks the lines up within milliseconds, a stopped one on its next
start. Every envelope of every file is validated first; if one is invalid
its problems are printed (FILE:LINE: path: rule), nothing is appended and
the exit code is 1.

Prints "queued TENANT/ID" per envelope, or "duplicate TENANT/ID" when the
store already has it (asked through the running outbox serve's socket
when there is one).

With --json it prints one JSON object on stdout instead, and the same exit
code: validate --json's (outbox help validate) with each envelope's status,
queued or duplicate, and, when nothing was appended, "ok": false and
"error" saying why.

With --database-url the envelopes go into the PostgreSQL store in one
transaction (all or none, consent checked as on POST /v1/envelopes), and
duplicates are always reported.

Flags:
`

func runEnqueue(ctx context.Context, e *env, args []string) int {
	s := newSettings("enqueue", e)
	s.usage(enqueueHelp)
	data := dataFlag(s)
	js := s.fs.Bool("json", false, "print the results as one JSON object on stdout (see above)")
	db := addDBFlags(s)
	if code, done := s.parse(args); done {
		return code
	}
	dsn, err := db.dsn(e)
	if err != nil {
		return fail(e, "%v", err)
	}
	files := s.fs.Args()
	if len(files) == 0 {
		fmt.Fprintln(e.Stderr, "Error: name at least one FILE (or - for stdin)\nTry: outbox help enqueue")
		return exitUsage
	}
	if code, ok := oneStdin(e, files, "enqueue"); !ok {
		return code
	}
	out := batchResult{OK: true, Files: []fileResult{}, Envelopes: []envelopeResult{}}
	var all []*envelope.Envelope
	var at, fileOf []int // index in out.Envelopes and out.Files of each of all
	for _, f := range files {
		in := loadFile(e, f)
		if !*js {
			in.printProblems(e)
		}
		for _, i := range in.at {
			at = append(at, len(out.Envelopes)+i)
			fileOf = append(fileOf, len(out.Files))
		}
		out.add(in)
		all = append(all, in.envs...)
	}
	// refuse ends the command with nothing appended.
	refuse := func(format string, a ...any) int {
		msg := fmt.Sprintf(format, a...)
		if !*js {
			return fail(e, "%s", msg)
		}
		out.OK, out.Error = false, msg
		if code := printJSON(e, out); code != exitOK {
			return code
		}
		return exitFailure
	}
	if !out.OK {
		return refuse("invalid envelopes: nothing was appended")
	}
	keys := make([]envelope.Key, len(all))
	for i, env := range all {
		if env.TenantID == "" {
			env.TenantID = envelope.DefaultTenant
		}
		keys[i] = envelope.Key{Tenant: env.TenantID, EnvelopeID: env.ID}
	}
	if dsn != "" {
		// The store validates, checks consent and dedupes, in one transaction.
		pg, err := openPG(ctx, dsn, *db.schema, true, "", queue.Options{Logger: newLogger(e, "text")})
		if err != nil {
			return refuse("%v", err)
		}
		res, err := pg.Enqueue(ctx, all...)
		pg.Close()
		if err != nil {
			return refuse("%v: nothing was stored", err)
		}
		for i, r := range res {
			out.Envelopes[at[i]].Status = enqueueQueued
			if r.Duplicate {
				out.Envelopes[at[i]].Status = enqueueDuplicate
			}
		}
		return printEnqueued(e, *js, out, all, at)
	}
	if err := checkOwner(*data); err != nil {
		return refuse("%v: nothing was stored", err)
	}
	if err := fileStoreDir(*data); err != nil {
		return refuse("%v: nothing was appended", err)
	}
	known, err := filestore.Known(*data, keys)
	if errors.Is(err, filestore.ErrStoreBusy) {
		// serve has the store: ask it (it dedupes when it indexes anyway,
		// but the answer, and the log, should not say queued twice).
		if known, err = knownByServe(ctx, *data, keys); err != nil {
			return refuse("ask the running serve which envelopes it has: %v", err)
		}
	} else if err != nil {
		return refuse("read the index: %v", err)
	}
	seen := map[envelope.Key]bool{}
	var fresh []*envelope.Envelope
	var freshAt []int // index in all of each of fresh
	for i, env := range all {
		if known[keys[i]] || seen[keys[i]] {
			out.Envelopes[at[i]].Status = enqueueDuplicate
			continue
		}
		seen[keys[i]] = true
		fresh = append(fresh, env)
		freshAt = append(freshAt, i)
	}
	now := time.Now()
	for i, env := range fresh {
		if queue.Expired(env.ExpiresAt, now) {
			r := &out.Envelopes[at[freshAt[i]]]
			r.OK, out.Files[fileOf[freshAt[i]]].OK = false, false
			// The HTTP API's problem for it (CodeExpired).
			r.Problems = []httpapi.Problem{{Index: r.Index, Path: "expires_at", Rule: "must be in the future"}}
			return refuse("envelope %s/%s: expires_at %s is already past (it could never be delivered): nothing was appended",
				env.TenantID, env.ID, env.ExpiresAt.UTC().Format(time.RFC3339))
		}
	}
	if len(fresh) > 0 {
		// Another process holding a log's lock would hang this command
		// without a word.
		waiting := func(waited time.Duration, acquired bool) {
			if !acquired {
				fmt.Fprintf(e.Stderr, "outbox enqueue: waiting %s so far for another process's lock on a user's log (a process appending to the logs must hold it only for its write and fsync; docs/data-format.md)\n", waited)
				return
			}
			fmt.Fprintf(e.Stderr, "outbox enqueue: the log's lock was released after %s; appending\n", waited.Round(time.Millisecond))
		}
		if err := filestore.AppendWaiting(*data, waiting, fresh...); err != nil {
			return refuse("%v", err)
		}
	}
	for _, i := range freshAt {
		out.Envelopes[at[i]].Status = enqueueQueued
	}
	return printEnqueued(e, *js, out, all, at)
}

// knownByServe reports which of keys the serve running on dir has, through
// its operator socket (none when no serve answers there).
func knownByServe(ctx context.Context, dir string, keys []envelope.Key) (map[envelope.Key]bool, error) {
	if !socketUp(dir) {
		return nil, nil
	}
	b, closeFn, err := openBackend(dir)
	if err != nil {
		return nil, err
	}
	defer closeFn()
	known := map[envelope.Key]bool{}
	for _, k := range keys {
		_, err := b.Get(ctx, k.Tenant, k.EnvelopeID)
		switch {
		case err == nil:
			known[k] = true
		case !errors.Is(err, queue.ErrNotFound):
			return nil, err
		}
	}
	return known, nil
}

// printEnqueued prints each envelope's status (or, with js, the result).
func printEnqueued(e *env, js bool, out batchResult, all []*envelope.Envelope, at []int) int {
	if js {
		return printJSON(e, out)
	}
	for i, env := range all {
		fmt.Fprintf(e.Stdout, "%s %s/%s\n", out.Envelopes[at[i]].Status, env.TenantID, env.ID)
	}
	return exitOK
}
