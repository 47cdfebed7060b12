// Package queue is outbox's store contract: what every store does, and
// the rules it does it by.
//
//   - Store is the contract (SPEC §3–§5): enqueue, claim, fenced commit,
//     release, recover, operator acts, consent, erase, prune.
//   - Lease, Outcome, ClaimRequest, the errors and Options are the shared
//     types; no store adds fields of its own to them.
//   - The policy: Backoff (retries and the attempt limit), Permits (who may
//     be sent what: the user's consent and the tenant's address
//     suppressions), Judge (what a claim does with a due row).
//   - The state machine (machine.go): Claim, Commit, Release, Recover,
//     ExpireLease, Requeue, Resolve, Refuse and Rebuilt compute every
//     change of an envelope's rows as a Step, checked against
//     envelope.Edges. A store loads an envelope's rows, calls one of them,
//     and writes the Step under its own fence-guarded transaction; it
//     decides nothing itself.
//
// The stores are leaves that import this package and nothing of each
// other: queue/filestore (per-user append logs indexed in bbolt, the
// default) and queue/memstore (in memory, for tests and small
// embeddings). queue/queuetest holds the contract suite and the
// differential test every store passes; queue/worker and queue/httpapi
// work on any Store.
package queue
