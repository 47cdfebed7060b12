package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/outboxhq/outbox/envelope"
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

const validateUsage = `Usage: outbox validate FILE...

Checks every envelope in each FILE ("-" is stdin) against the envelope
JSON Schema and the rules a schema cannot state (the moat rule, deep
links, zero-item digests, times, recipients, id limits). A FILE holds one
envelope, a JSON array of envelopes, or JSON Lines (one envelope per line).

For a valid FILE it prints "ok FILE: N envelope(s)" on stdout. Otherwise it
prints one line per problem on stderr,

  FILE:LINE: json.path: rule

where LINE is the line on which the envelope (or array element) starts,
and exits 1. Nothing is stored or sent.
`

const schemaUsage = `Usage: outbox schema

Prints the envelope JSON Schema (draft 2020-12, schema_version "1") on
stdout, so that producers in other languages can validate with their own
validator. The fixtures in testdata/delivery/ show what passes and fails.
`

func runValidate(ctx context.Context, e *env, args []string) int {
	flags := flag.NewFlagSet("validate", flag.ContinueOnError)
	flags.Usage = func() { fmt.Fprint(flags.Output(), validateUsage) }
	if code, done := parseFlags(flags, e, args); done {
		return code
	}
	files := flags.Args()
	if len(files) == 0 {
		fmt.Fprintf(e.Stderr, "Error: validate needs at least one FILE (\"-\" for stdin)\nTry: outbox help validate\n")
		return exitUsage
	}
	stdinUsed := false
	for _, f := range files {
		if f == "-" {
			if stdinUsed {
				fmt.Fprintf(e.Stderr, "Error: \"-\" (stdin) given more than once\nTry: outbox help validate\n")
				return exitUsage
			}
			stdinUsed = true
		}
	}

	code := exitOK
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return fail(e, "validate: %v", err)
		}
		if !validateFile(e, f) {
			code = exitFailure
		}
	}
	return code
}

// validateFile checks one file, printing its result; it reports whether
// every envelope in it is valid.
func validateFile(e *env, name string) bool {
	display, envs, ok := readEnvelopes(e, name)
	if ok {
		fmt.Fprintf(e.Stdout, "ok %s: %d envelope(s)\n", display, len(envs))
	}
	return ok
}

// readEnvelopes reads and validates the envelopes of one file ("-" is
// stdin): one envelope, a JSON array or JSON Lines. It prints every problem
// as FILE:LINE: path: rule on stderr and reports whether all were valid.
func readEnvelopes(e *env, name string) (display string, envs []*envelope.Envelope, ok bool) {
	display = name
	var (
		data []byte
		err  error
	)
	if name == "-" {
		display = "<stdin>"
		data, err = io.ReadAll(e.Stdin)
	} else {
		data, err = os.ReadFile(name)
	}
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the name is already on the line
		}
		fmt.Fprintf(e.Stderr, "%s: cannot read: %v\n", display, err)
		return display, nil, false
	}

	inputs, err := envelope.SplitInput(data)
	if err != nil {
		var ie *envelope.InputError
		if errors.As(err, &ie) {
			fmt.Fprintf(e.Stderr, "%s:%d: %s\n", display, ie.Line, envelope.Problem{Rule: ie.Reason})
		} else {
			fmt.Fprintf(e.Stderr, "%s:1: %s\n", display, envelope.Problem{Rule: err.Error()})
		}
		return display, nil, false
	}
	if len(inputs) == 0 {
		fmt.Fprintf(e.Stderr, "%s:1: %s\n", display, envelope.Problem{Rule: "no envelope in the file"})
		return display, nil, false
	}

	ok = true
	for _, in := range inputs {
		env, err := envelope.Parse(in.Data)
		if err == nil {
			envs = append(envs, env)
			continue
		}
		ok = false
		var ve *envelope.ValidationError
		if !errors.As(err, &ve) {
			fmt.Fprintf(e.Stderr, "%s:%d: %s\n", display, in.Line, envelope.Problem{Rule: err.Error()})
			continue
		}
		for _, p := range ve.Problems {
			fmt.Fprintf(e.Stderr, "%s:%d: %s\n", display, in.Line, p)
		}
	}
	return display, envs, ok
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
