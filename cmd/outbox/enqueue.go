package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
	"github.com/outboxhq/outbox/queue/filestore"
)

func init() {
	register(&command{Name: "enqueue", Short: "append envelopes to their users' logs (no daemon needed)", Run: runEnqueue})
}

const enqueueHelp = `Usage: outbox enqueue [--data DIR] FILE...|-

Appends envelopes (a file holds one envelope, a JSON array or JSON Lines; -
reads stdin) to their users' append logs in --data, each log under its
exclusive lock with an fsync, without opening the store: a running outbox
serve picks the lines up within milliseconds, a stopped one on its next
start. Every envelope of every file is validated first; if one is invalid
its problems are printed (FILE:LINE: path: rule), nothing is appended and
the exit code is 1.

Prints "queued TENANT/ID" per envelope, or "duplicate TENANT/ID" when the
store is readable (outbox serve not running) and already has it.

Flags:
`

func runEnqueue(ctx context.Context, e *env, args []string) int {
	s := newSettings("enqueue", e)
	s.usage(enqueueHelp)
	data := dataFlag(s)
	if code, done := s.parse(args); done {
		return code
	}
	files := s.fs.Args()
	if len(files) == 0 {
		fmt.Fprintln(e.Stderr, "Error: name at least one FILE (or - for stdin)\nTry: outbox help enqueue")
		return exitUsage
	}
	var all []*envelope.Envelope
	ok := true
	for _, f := range files {
		_, envs, fileOK := readEnvelopes(e, f)
		ok = ok && fileOK
		all = append(all, envs...)
	}
	if !ok {
		fmt.Fprintln(e.Stderr, "Error: invalid envelopes: nothing was appended")
		return exitFailure
	}
	keys := make([]envelope.Key, len(all))
	for i, env := range all {
		if env.TenantID == "" {
			env.TenantID = envelope.DefaultTenant
		}
		keys[i] = envelope.Key{Tenant: env.TenantID, EnvelopeID: env.ID}
	}
	known, err := filestore.Known(*data, keys)
	if errors.Is(err, filestore.ErrStoreBusy) {
		known = nil // serve has the store: it dedupes when it indexes
	} else if err != nil {
		return fail(e, "read the index: %v", err)
	}
	seen := map[envelope.Key]bool{}
	var fresh []*envelope.Envelope
	for i, env := range all {
		if known[keys[i]] || seen[keys[i]] {
			fmt.Fprintf(e.Stdout, "duplicate %s/%s\n", env.TenantID, env.ID)
			continue
		}
		seen[keys[i]] = true
		fresh = append(fresh, env)
	}
	if len(fresh) == 0 {
		return exitOK
	}
	now := time.Now()
	for _, env := range fresh {
		if queue.Expired(env.ExpiresAt, now) {
			return fail(e, "envelope %s/%s: expires_at %s is already past (it could never be delivered): nothing was appended",
				env.TenantID, env.ID, env.ExpiresAt.UTC().Format(time.RFC3339))
		}
	}
	if err := filestore.Append(*data, fresh...); err != nil {
		return fail(e, "%v", err)
	}
	for _, env := range fresh {
		fmt.Fprintf(e.Stdout, "queued %s/%s\n", env.TenantID, env.ID)
	}
	return exitOK
}
