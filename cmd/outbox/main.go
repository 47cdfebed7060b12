// Command outbox is the one binary of outbox: the daemon (serve), the demo,
// and the operator and author tools (enqueue, validate, render, ls, show,
// requeue, resolve, erase, doctor, compact, stats, vapid-keys, schema,
// version). Run "outbox help" for the list.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"sort"
	"syscall"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// env is what a command sees of the process: its arguments' streams and
// environment. Tests run commands in-process with their own env.
type env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Getenv func(string) string
	// Environ lists the environment (os.Environ), for settings named by a
	// pattern (OUTBOX_WECOM_ROBOT_<NAME>_KEY); nil means none.
	Environ func() []string
	// describe, when set, receives the command's flag set in place of
	// parsing (parseFlags), and the command returns: how completion
	// learns each command's flags.
	describe func(*flag.FlagSet)
}

// command is one subcommand.
type command struct {
	Name  string
	Short string
	// Run executes the command with its arguments (without the command
	// name) and returns the process exit code.
	Run func(ctx context.Context, e *env, args []string) int
	// Words are the words its first argument may be (consent show|set|lift),
	// for completion.
	Words []string
}

var commands = map[string]*command{}

// builtins are the words run handles itself, after the commands in usage.
var builtins = []command{
	{Name: "version", Short: "print the version"},
	{Name: "help", Short: "this list; \"outbox help CMD\" shows a command's flags"},
}

// register adds a subcommand; each lives in its own file.
func register(c *command) {
	if _, dup := commands[c.Name]; dup {
		panic("outbox: command registered twice: " + c.Name)
	}
	commands[c.Name] = c
}

func main() {
	// outbox's heap is small (bbolt data lives in its memory map): trade a
	// little memory for less GC work per message, unless GOGC is set.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	e := &env{Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv, Environ: os.Environ}
	code := run(ctx, e, os.Args[1:])
	stop()
	os.Exit(code)
}

// run dispatches to the subcommand named by args[0].
func run(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 {
		usage(e.Stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok {
				return c.Run(ctx, e, []string{"-help"})
			}
		}
		usage(e.Stdout)
		return exitOK
	case "version", "-version", "--version":
		fmt.Fprintln(e.Stdout, "outbox", buildVersion())
		return exitOK
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(e.Stderr, "Error: unknown command %q\nTry: outbox help\n", name)
		return exitUsage
	}
	return c.Run(ctx, e, args[1:])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "outbox: a file-backed delivery queue (Web Push, Resend email, Telegram).")
	fmt.Fprintln(w, "\nUsage: outbox <command> [flags] [args]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-11s %s\n", n, commands[n].Short)
	}
	for _, b := range builtins {
		fmt.Fprintf(w, "  %-11s %s\n", b.Name, b.Short)
	}
}

// parseFlags parses args with fs, printing usage errors the way every
// command does. It returns (exit code, done): done is true when the caller
// must return the code at once (help or a usage error).
//
// Flags may come before and after the arguments (outbox resolve ID --as
// sent); "--" ends the flags, and what follows it is arguments only.
func parseFlags(fs *flag.FlagSet, e *env, args []string) (int, bool) {
	if e.describe != nil {
		e.describe(fs)
		return exitOK, true
	}
	fs.SetOutput(e.Stderr)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return exitOK, true
			}
			fmt.Fprintf(e.Stderr, "Try: outbox help %s\n", fs.Name())
			return exitUsage, true
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		// Parse stops at the first argument or just after "--".
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	// Leave every argument in fs.Args(), in order; "--" stops a re-parse.
	_ = fs.Parse(append([]string{"--"}, pos...))
	return 0, false
}

// envOr returns the environment variable name's value, or def when unset.
func envOr(e *env, name, def string) string {
	if v := e.Getenv(name); v != "" {
		return v
	}
	return def
}

// fail prints "Error: msg" and returns exitFailure.
func fail(e *env, format string, a ...any) int {
	fmt.Fprintf(e.Stderr, "Error: "+format+"\n", a...)
	return exitFailure
}
