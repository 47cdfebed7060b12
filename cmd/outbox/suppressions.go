package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue"
)

// The tenant's address suppressions: an operator lists them (by target:
// the store never keeps an address), adds one by hand, or lifts one.

func (d *directBackend) SuppressEmail(ctx context.Context, t, address string, reason envelope.ErrorClass) error {
	return d.q.SuppressEmail(ctx, t, address, reason)
}
func (d *directBackend) AddressSuppressions(ctx context.Context, t string) ([]queue.Suppression, error) {
	return d.q.AddressSuppressions(ctx, t)
}
func (d *directBackend) LiftAddressSuppression(ctx context.Context, t, target string) error {
	return d.q.LiftAddressSuppression(ctx, t, target)
}

func (s *socketBackend) SuppressEmail(ctx context.Context, t, address string, reason envelope.ErrorClass) error {
	return s.call(ctx, "suppress-email", opRequest{Tenant: t, Address: address, Reason: reason}, nil)
}
func (s *socketBackend) AddressSuppressions(ctx context.Context, t string) ([]queue.Suppression, error) {
	var list []queue.Suppression
	return list, s.call(ctx, "address-suppressions", opRequest{Tenant: t}, &list)
}
func (s *socketBackend) LiftAddressSuppression(ctx context.Context, t, target string) error {
	return s.call(ctx, "lift-address", opRequest{Tenant: t, Address: target}, nil)
}

// handleAddressOps serves the address suppression calls on the operator
// socket.
func handleAddressOps(handle func(string, func(context.Context, opRequest) (any, error)), b backend) {
	handle("suppress-email", func(ctx context.Context, r opRequest) (any, error) {
		return nil, b.SuppressEmail(ctx, r.Tenant, r.Address, r.Reason)
	})
	handle("address-suppressions", func(ctx context.Context, r opRequest) (any, error) {
		return b.AddressSuppressions(ctx, r.Tenant)
	})
	handle("lift-address", func(ctx context.Context, r opRequest) (any, error) {
		return nil, b.LiftAddressSuppression(ctx, r.Tenant, r.Address)
	})
}

// addressTarget returns the target an operator names: an address (it has
// an @) is hashed, anything else is taken as a target already.
func addressTarget(arg string) string {
	if strings.Contains(arg, "@") {
		return queue.TargetOfValue("email:" + arg)
	}
	return arg
}

var suppressReason *string

func init() {
	const usage = "list | add ADDRESS [--reason bounced|complaint|unsubscribed] | lift ADDRESS|TARGET"
	register(opCommand("suppressions", "the tenant's e-mail address suppressions (bounces, complaints): list, add or lift", usage+" [--json]",
		func(ctx context.Context, e *env, b backend, tenant string, js bool, args []string) int {
			bad := func() int {
				fmt.Fprintln(e.Stderr, "Error: usage: outbox suppressions "+usage)
				return exitUsage
			}
			if len(args) == 0 {
				return bad()
			}
			switch args[0] {
			case "list":
				if len(args) != 1 {
					return bad()
				}
			case "add":
				if len(args) != 2 || !strings.Contains(args[1], "@") {
					return bad()
				}
				reason := envelope.ErrorClass(*suppressReason)
				switch reason {
				case envelope.ClassBounced, envelope.ClassComplaint, envelope.ClassUnsubscribed:
				default:
					fmt.Fprintln(e.Stderr, "Error: --reason must be bounced, complaint or unsubscribed")
					return exitUsage
				}
				if err := b.SuppressEmail(ctx, tenant, args[1], reason); err != nil {
					return opErr(e, err)
				}
				fmt.Fprintf(e.Stdout, "suppressed %s in %s (target %s)\n", args[1], tenant, addressTarget(args[1]))
				return exitOK
			case "lift":
				if len(args) != 2 {
					return bad()
				}
				target := addressTarget(args[1])
				if err := b.LiftAddressSuppression(ctx, tenant, target); err != nil {
					return opErr(e, err)
				}
				fmt.Fprintf(e.Stdout, "lifted the suppression of target %s in %s\n", target, tenant)
				return exitOK
			default:
				return bad()
			}
			list, err := b.AddressSuppressions(ctx, tenant)
			if err != nil {
				return opErr(e, err)
			}
			if js {
				if list == nil {
					list = []queue.Suppression{}
				}
				return printJSON(e, list)
			}
			tw := tabwriter.NewWriter(e.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TARGET\tREASON\tSINCE")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Target, s.Reason, s.At.Format(time.RFC3339))
			}
			tw.Flush()
			return exitOK
		}, func(s *settings) {
			suppressReason = s.fs.String("reason", string(envelope.ClassBounced), "add: bounced, complaint or unsubscribed")
		}))
}
