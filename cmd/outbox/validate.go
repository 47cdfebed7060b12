package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/queue/httpapi"
)

func init() {
	register(&command{
		Name:  "validate",
		Short: "check envelope files against the JSON Schema and the Go rules",
		Run:   runValidate,
	})
	register(&command{
		Name:  "schema",
		Short: "print the envelope JSON Schema (draft 2020-12)",
		Run:   runSchema,
	})
}

const validateUsage = `Usage: outbox validate [--json] FILE...

Checks every envelope in each FILE ("-" is stdin) against the envelope
JSON Schema and the rules a schema cannot state (the moat rule, deep
links, zero-item digests, times, recipients, id limits). A FILE holds one
envelope, a JSON array of envelopes, or JSON Lines (one envelope per line).

For a valid FILE it prints "ok FILE: N envelope(s)" on stdout. Otherwise it
prints one line per problem on stderr,

  FILE:LINE: json.path: rule

where LINE is the line on which the envelope (or array element) starts,
and exits 1. Nothing is stored or sent.

With --json it prints one JSON object on stdout instead, and the same exit
code: {"ok", "files": [{"file", "ok", "envelopes", "problem": {"line",
"rule"}}], "envelopes": [{"file", "line", "index", "tenant_id", "id", "ok",
"problems": [{"index", "path", "rule"}]}]}; index counts a file's envelopes
from 0, problems have the HTTP API's shape.

Flags:
`

const schemaUsage = `Usage: outbox schema

Prints the envelope JSON Schema (draft 2020-12, schema_version "1") on
stdout, so that producers in other languages can validate with their own
validator. The fixtures in testdata/delivery/ show what passes and fails.
`

func runValidate(ctx context.Context, e *env, args []string) int {
	flags := flag.NewFlagSet("validate", flag.ContinueOnError)
	flags.Usage = func() { fmt.Fprint(flags.Output(), validateUsage); flags.PrintDefaults() }
	js := flags.Bool("json", false, "print the results as one JSON object on stdout (see above)")
	if code, done := parseFlags(flags, e, args); done {
		return code
	}
	files := flags.Args()
	if len(files) == 0 {
		fmt.Fprintf(e.Stderr, "Error: validate needs at least one FILE (\"-\" for stdin)\nTry: outbox help validate\n")
		return exitUsage
	}
	if code, ok := oneStdin(e, files, "validate"); !ok {
		return code
	}

	out := batchResult{OK: true, Files: []fileResult{}, Envelopes: []envelopeResult{}}
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return fail(e, "validate: %v", err)
		}
		in := loadFile(e, f)
		out.add(in)
		if *js {
			continue
		}
		in.printProblems(e)
		if in.ok() {
			fmt.Fprintf(e.Stdout, "ok %s: %d envelope(s)\n", in.file.File, len(in.envs))
		}
	}
	if *js {
		if code := printJSON(e, out); code != exitOK {
			return code
		}
	}
	if !out.OK {
		return exitFailure
	}
	return exitOK
}

// oneStdin refuses "-" named twice.
func oneStdin(e *env, files []string, cmd string) (int, bool) {
	stdinUsed := false
	for _, f := range files {
		if f == "-" {
			if stdinUsed {
				fmt.Fprintf(e.Stderr, "Error: \"-\" (stdin) given more than once\nTry: outbox help %s\n", cmd)
				return exitUsage, false
			}
			stdinUsed = true
		}
	}
	return 0, true
}

// batchResult is what validate --json and enqueue --json print.
type batchResult struct {
	OK bool `json:"ok"`
	// Error says why enqueue appended nothing (invalid envelopes, an
	// unreadable index, a failed append).
	Error     string           `json:"error,omitempty"`
	Files     []fileResult     `json:"files"`
	Envelopes []envelopeResult `json:"envelopes"`
}

func (b *batchResult) add(in *loadedFile) {
	b.OK = b.OK && in.ok()
	b.Files = append(b.Files, in.file)
	b.Envelopes = append(b.Envelopes, in.results...)
}

// fileResult is one FILE: how many envelopes it holds, or why it could
// not be read or cut into envelopes.
type fileResult struct {
	File      string       `json:"file"`
	OK        bool         `json:"ok"`
	Envelopes int          `json:"envelopes"`
	Problem   *fileProblem `json:"problem,omitempty"`
}

type fileProblem struct {
	Line int    `json:"line,omitempty"` // 0: the file as a whole (it cannot be read)
	Rule string `json:"rule"`
}

// envelopeResult is one envelope of a FILE. Index counts the file's
// envelopes from 0, as the problems' index does (the HTTP API's shape,
// where it counts a request's envelopes); Line is where the envelope
// starts. Status is enqueue's: queued or duplicate.
type envelopeResult struct {
	File     string            `json:"file"`
	Line     int               `json:"line"`
	Index    int               `json:"index"`
	Tenant   string            `json:"tenant_id,omitempty"`
	ID       string            `json:"id,omitempty"`
	OK       bool              `json:"ok"`
	Status   string            `json:"status,omitempty"`
	Problems []httpapi.Problem `json:"problems,omitempty"`
}

// Statuses of enqueue's envelopes.
const (
	enqueueQueued    = "queued"
	enqueueDuplicate = "duplicate"
)

// loadedFile is one FILE read and validated.
type loadedFile struct {
	file    fileResult
	results []envelopeResult
	envs    []*envelope.Envelope // the valid ones
	at      []int                // index in results of each of envs
}

func (f *loadedFile) ok() bool { return f.file.OK }

// printProblems prints the file's problems, FILE:LINE: path: rule, on
// stderr.
func (f *loadedFile) printProblems(e *env) {
	if p := f.file.Problem; p != nil && p.Line == 0 {
		fmt.Fprintf(e.Stderr, "%s: %s\n", f.file.File, p.Rule)
	} else if p != nil {
		fmt.Fprintf(e.Stderr, "%s:%d: %s\n", f.file.File, p.Line, envelope.Problem{Rule: p.Rule})
	}
	for _, r := range f.results {
		for _, p := range r.Problems {
			fmt.Fprintf(e.Stderr, "%s:%d: %s\n", f.file.File, r.Line, envelope.Problem{Path: p.Path, Rule: p.Rule})
		}
	}
}

// loadFile reads and validates the envelopes of one file ("-" is stdin):
// one envelope, a JSON array or JSON Lines.
func loadFile(e *env, name string) *loadedFile {
	f := &loadedFile{file: fileResult{File: name}}
	var (
		data []byte
		err  error
	)
	if name == "-" {
		f.file.File = "<stdin>"
		data, err = io.ReadAll(e.Stdin)
	} else {
		data, err = os.ReadFile(name)
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the name is already on the line
		}
		f.file.Problem = &fileProblem{Rule: "cannot read: " + err.Error()}
		return f
	}

	inputs, err := envelope.SplitInput(data)
	if err != nil {
		var ie *envelope.InputError
		if errors.As(err, &ie) {
			f.file.Problem = &fileProblem{Line: ie.Line, Rule: ie.Reason}
		} else {
			f.file.Problem = &fileProblem{Line: 1, Rule: err.Error()}
		}
		return f
	}
	if len(inputs) == 0 {
		f.file.Problem = &fileProblem{Line: 1, Rule: "no envelope in the file"}
		return f
	}

	f.file.OK = true
	for i, in := range inputs {
		r := envelopeResult{File: f.file.File, Line: in.Line, Index: i}
		env, err := envelope.Parse(in.Data)
		var ve *envelope.ValidationError
		switch {
		case err == nil:
			r.OK, r.Tenant, r.ID = true, env.Tenant(), env.ID
			f.envs = append(f.envs, env)
			f.at = append(f.at, len(f.results))
		case errors.As(err, &ve):
			for _, p := range ve.Problems {
				r.Problems = append(r.Problems, httpapi.Problem{Index: i, Path: p.Path, Rule: p.Rule})
			}
			r.Tenant, r.ID = namedKey(in.Data, r.Problems)
		default:
			r.Problems = []httpapi.Problem{{Index: i, Rule: err.Error()}}
		}
		f.file.OK = f.file.OK && r.OK
		f.results = append(f.results, r)
	}
	f.file.Envelopes = len(inputs)
	return f
}

// namedKey returns the tenant and id an invalid envelope names, when they
// are strings without a problem of their own, so that a result says which
// envelope it is.
func namedKey(data []byte, problems []httpapi.Problem) (tenant, id string) {
	var head struct {
		Tenant any `json:"tenant_id"`
		ID     any `json:"id"`
	}
	if json.Unmarshal(data, &head) != nil {
		return "", ""
	}
	for _, p := range problems {
		switch p.Path {
		case "tenant_id":
			head.Tenant = nil
		case "id":
			head.ID = nil
		}
	}
	id, _ = head.ID.(string)
	if id == "" {
		return "", ""
	}
	tenant, _ = head.Tenant.(string)
	if tenant == "" {
		tenant = envelope.DefaultTenant
	}
	return tenant, id
}

func runSchema(_ context.Context, e *env, args []string) int {
	flags := flag.NewFlagSet("schema", flag.ContinueOnError)
	flags.Usage = func() { fmt.Fprint(flags.Output(), schemaUsage) }
	if code, done := parseFlags(flags, e, args); done {
		return code
	}
	if flags.NArg() > 0 {
		fmt.Fprintf(e.Stderr, "Error: schema takes no arguments\nTry: outbox help schema\n")
		return exitUsage
	}
	if _, err := e.Stdout.Write(envelope.Schema()); err != nil {
		return fail(e, "write schema: %v", err)
	}
	return exitOK
}
