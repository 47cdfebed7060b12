package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// selection is the rows ls lists and resolve --all and requeue --all act
// on: a List filter, and the class and the user, which List does not
// filter on.
type selection struct {
	filter queue.ListFilter // Tenant ("" = every tenant), State, Channel
	class  envelope.ErrorClass
	user   string
}

// rows returns up to limit rows of sel (0 = every one), paging through the
// store, whose pages hold at most 1000 rows; more says rows were left out.
func (sel selection) rows(ctx context.Context, b backend, limit int) (rows []queue.Row, more bool, err error) {
	f := sel.filter
	f.Limit, f.Cursor = 1000, ""
	for {
		p, err := b.List(ctx, f)
		if err != nil {
			return nil, false, err
		}
		for _, r := range p.Rows {
			if (sel.class != "" && r.Class != sel.class) || (sel.user != "" && r.UserID != sel.user) {
				continue
			}
			if limit > 0 && len(rows) == limit {
				return rows, true, nil
			}
			rows = append(rows, r)
		}
		if p.Next == "" {
			return rows, false, nil
		}
		f.Cursor = p.Next
	}
}

// describe says which rows sel picks, for a summary line.
func (sel selection) describe() string {
	var parts []string
	if sel.filter.Tenant == "" {
		parts = append(parts, "every tenant")
	} else {
		parts = append(parts, fmt.Sprintf("tenant %q", sel.filter.Tenant))
	}
	if sel.filter.State != "" {
		parts = append(parts, "state "+string(sel.filter.State))
	}
	if sel.filter.Channel != "" {
		parts = append(parts, "channel "+string(sel.filter.Channel))
	}
	if sel.class != "" {
		parts = append(parts, "class "+string(sel.class))
	}
	if sel.user != "" {
		parts = append(parts, "user "+sel.user)
	}
	return strings.Join(parts, ", ")
}

// bulkFailure is one envelope a bulk command did not change, and why.
type bulkFailure struct {
	Tenant string `json:"tenant"`
	ID     string `json:"id"`
	Error  string `json:"error"`
}

// bulkResult is what resolve --all and requeue --all did.
type bulkResult struct {
	Matched int           `json:"matched"` // envelopes with a row in the selection
	Done    int           `json:"done"`
	DryRun  bool          `json:"dry_run,omitempty"`
	Failed  []bulkFailure `json:"failed,omitempty"`
}

// bulk applies act, once per envelope, to every envelope with a row in
// sel. The selection is listed first and acted on after, so an action that
// moves a row out of the selection cannot disturb the paging. Each call
// goes through the store's own rule for one envelope (the same as outbox
// resolve ID or requeue ID): a row that changed in between is refused
// there, with its reason, and the others go on. Interrupted (^C), it stops
// between two envelopes and reports what it did.
func bulk(ctx context.Context, b backend, sel selection, dryRun bool, act func(ctx context.Context, tenant, id string) error) (*bulkResult, error) {
	rows, _, err := sel.rows(ctx, b, 0)
	if err != nil {
		return nil, err
	}
	type envKey struct{ tenant, id string }
	seen := map[envKey]bool{}
	var keys []envKey
	for _, r := range rows {
		k := envKey{r.Key.Tenant, r.Key.EnvelopeID}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	res := &bulkResult{Matched: len(keys), DryRun: dryRun}
	if dryRun {
		return res, nil
	}
	for _, k := range keys {
		if ctx.Err() != nil {
			return res, fmt.Errorf("interrupted after %d of %d envelopes", res.Done+len(res.Failed), len(keys))
		}
		if err := act(ctx, k.tenant, k.id); err != nil {
			if ctx.Err() != nil {
				return res, fmt.Errorf("interrupted after %d of %d envelopes", res.Done+len(res.Failed), len(keys))
			}
			msg := err.Error()
			if errors.Is(err, queue.ErrNotFound) {
				msg = "not found (erased or pruned since it was listed)"
			}
			res.Failed = append(res.Failed, bulkFailure{Tenant: k.tenant, ID: k.id, Error: msg})
			continue
		}
		res.Done++
	}
	return res, nil
}

// printBulk reports a bulk command: verb is "resolve" or "requeue", done
// its past ("resolved"), how the rest of the phrase (" as sent").
func printBulk(e *env, js bool, sel selection, verb, done, how string, res *bulkResult, err error) int {
	if js && res != nil {
		printJSON(e, res)
	} else if res != nil {
		noun := "envelopes"
		if res.Matched == 1 {
			noun = "envelope"
		}
		switch {
		case res.DryRun:
			fmt.Fprintf(e.Stdout, "would %s %d %s%s (%s); run it again without --dry-run to do it\n", verb, res.Matched, noun, how, sel.describe())
		default:
			fmt.Fprintf(e.Stdout, "%s %d of %d %s%s (%s)\n", done, res.Done, res.Matched, noun, how, sel.describe())
		}
		const shown = 20
		for i, f := range res.Failed {
			if i == shown {
				fmt.Fprintf(e.Stderr, "… and %d more (--json lists them all)\n", len(res.Failed)-shown)
				break
			}
			fmt.Fprintf(e.Stderr, "not %s: %s/%s: %s\n", done, f.Tenant, f.ID, f.Error)
		}
	}
	if err != nil {
		return fail(e, "%v", err)
	}
	if len(res.Failed) > 0 {
		return fail(e, "%d envelopes were not %s (listed above)", len(res.Failed), done)
	}
	return exitOK
}

// newSelection builds a selection from its flags or form fields; tenant
// "*" or "" is every tenant.
func newSelection(tenant, state, channel, class, user string) (selection, error) {
	sel := selection{class: envelope.ErrorClass(class), user: user}
	if tenant != "*" {
		sel.filter.Tenant = tenant
	}
	var err error
	if state != "" {
		if sel.filter.State, err = envelope.ParseState(state); err != nil {
			return sel, fmt.Errorf("--state %q: %v", state, err)
		}
	}
	if channel != "" {
		if sel.filter.Channel, err = envelope.ParseChannel(channel); err != nil {
			return sel, fmt.Errorf("--channel %q: %v", channel, err)
		}
	}
	return sel, nil
}

// parseSelection is newSelection for a command: on a bad flag it has
// written the error, and ok is false.
func parseSelection(e *env, tenant, state, channel, class, user string) (sel selection, code int, ok bool) {
	sel, err := newSelection(tenant, state, channel, class, user)
	if err != nil {
		fmt.Fprintf(e.Stderr, "Error: %v\n", err)
		return sel, exitUsage, false
	}
	return sel, exitOK, true
}

// bulkFlags are resolve's and requeue's flags for acting on every envelope
// of a selection.
type bulkFlags struct {
	all, dryRun                 *bool
	state, channel, class, user *string
}

func addBulkFlags(s *settings, withState bool) *bulkFlags {
	f := &bulkFlags{
		all:     s.fs.Bool("all", false, "act on every envelope with a row that the filters pick (--tenant '*' for every tenant), not on one ID"),
		dryRun:  s.fs.Bool("dry-run", false, "with --all: count what it would act on, change nothing"),
		channel: s.fs.String("channel", "", "with --all: only rows of this channel"),
		class:   s.fs.String("class", "", "with --all: only rows with this error class (index_rebuilt, database_restored, reconcile_unknown, …)"),
		user:    s.fs.String("user", "", "with --all: only this user's rows"),
	}
	empty := ""
	f.state = &empty
	if withState {
		f.state = s.fs.String("state", "", "with --all: only rows in this state (dead_letter, unresolved, expired, suppressed); required")
	}
	return f
}

// used says whether a filter flag was given, for the error of one without
// --all.
func (f *bulkFlags) used() bool {
	return *f.dryRun || *f.state != "" || *f.channel != "" || *f.class != "" || *f.user != ""
}
