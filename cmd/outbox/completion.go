package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// completionShells are the shells outbox completion writes a script for.
var completionShells = []string{"bash", "zsh"}

func init() {
	register(&command{Name: "completion", Short: "print a shell completion script: completion bash|zsh", Run: runCompletion})
}

const completionUsage = `Usage: outbox completion bash|zsh

Prints a script that completes outbox's commands and each command's flags,
made from the commands and flags of this binary. Install it with

  outbox completion bash > ~/.local/share/bash-completion/completions/outbox
  outbox completion zsh > "${fpath[1]}/_outbox"      # then: compinit

or load it for the current shell: source <(outbox completion bash).
`

func runCompletion(_ context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("completion", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), completionUsage) }
	if code, done := parseFlags(fs, e, args); done {
		return code
	}
	if fs.NArg() != 1 || !slices.Contains(completionShells, fs.Arg(0)) {
		fmt.Fprintf(e.Stderr, "Error: completion needs one shell: %s\nTry: outbox help completion\n", strings.Join(completionShells, " or "))
		return exitUsage
	}
	specs, err := commandSpecs()
	if err != nil {
		return fail(e, "%v", err)
	}
	write := bashCompletion
	if fs.Arg(0) == "zsh" {
		write = zshCompletion
	}
	write(e.Stdout, specs)
	return exitOK
}

// cmdSpec is what completion knows of one command.
type cmdSpec struct {
	Name, Short string
	Flags       []flagSpec
	// Words are the words its first argument can be (help: the commands,
	// completion: the shells); none means files.
	Words []string
}

type flagSpec struct {
	Name, Usage string
	// Value names the flag's value ("string", "duration", "DIR"); "" for a
	// boolean flag, which takes none.
	Value string
}

var completionWord = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// leadWords reads the words a command's first argument may be from its
// usage line: "show|set|lift USER …" or "list | add ADDRESS … | lift …";
// none when it starts with a placeholder (ID, USER).
func leadWords(usage string) []string {
	first, _, _ := strings.Cut(usage, " ")
	alts := strings.Split(first, "|")
	if len(alts) == 1 {
		alts = nil
		for _, part := range strings.Split(usage, " | ") {
			w, _, _ := strings.Cut(strings.TrimSpace(part), " ")
			alts = append(alts, w)
		}
	}
	if len(alts) < 2 {
		return nil
	}
	for _, w := range alts {
		if !completionWord.MatchString(w) {
			return nil
		}
	}
	return alts
}

// commandSpecs lists every command of the table with the flags its own
// flag set defines, then the builtins.
func commandSpecs() ([]cmdSpec, error) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var specs []cmdSpec
	for _, n := range names {
		fs := commandFlags(commands[n])
		if fs == nil {
			return nil, fmt.Errorf("completion: command %s does not parse its flags with parseFlags", n)
		}
		s := cmdSpec{Name: n, Short: commands[n].Short}
		var bad error
		fs.VisitAll(func(f *flag.Flag) {
			if !completionWord.MatchString(f.Name) {
				bad = fmt.Errorf("completion: flag %q of %s is not a plain word", f.Name, n)
			}
			value, usage := flag.UnquoteUsage(f)
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				value = ""
			}
			s.Flags = append(s.Flags, flagSpec{Name: f.Name, Usage: usage, Value: value})
		})
		if bad != nil {
			return nil, bad
		}
		s.Words = commands[n].Words
		if n == "completion" {
			s.Words = completionShells
		}
		specs = append(specs, s)
	}
	for _, b := range builtins {
		s := cmdSpec{Name: b.Name, Short: b.Short}
		if b.Name == "help" {
			s.Words = names
		}
		specs = append(specs, s)
	}
	for _, s := range specs {
		if !completionWord.MatchString(s.Name) {
			return nil, fmt.Errorf("completion: command %q is not a plain word", s.Name)
		}
	}
	return specs, nil
}

// commandFlags returns the flag set c parses, by running c with an env
// whose describe hook takes the set before anything is parsed or done.
func commandFlags(c *command) *flag.FlagSet {
	var got *flag.FlagSet
	e := &env{
		Stdin: strings.NewReader(""), Stdout: io.Discard, Stderr: io.Discard,
		Getenv:   func(string) string { return "" },
		describe: func(fs *flag.FlagSet) { got = fs },
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // should a command not stop at parseFlags, it finds its context done
	c.Run(ctx, e, []string{"-help"})
	return got
}

func bashCompletion(w io.Writer, specs []cmdSpec) {
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	fmt.Fprintf(w, `# bash completion for outbox %s, written by "outbox completion bash".
_outbox() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    COMPREPLY=()
    if (( COMP_CWORD == 1 )); then
        COMPREPLY=($(compgen -W '%s' -- "$cur"))
        return
    fi
    local flags='' valued='' words=''
    case ${COMP_WORDS[1]} in
`, buildVersion(), strings.Join(names, " "))
	for _, s := range specs {
		var flags, valued []string
		for _, f := range s.Flags {
			flags = append(flags, "--"+f.Name)
			if f.Value != "" {
				valued = append(valued, f.Name)
			}
		}
		fmt.Fprintf(w, "    %s) flags='%s' valued=' %s ' words='%s' ;;\n", s.Name, strings.Join(flags, " "), strings.Join(valued, " "), strings.Join(s.Words, " "))
	}
	fmt.Fprint(w, `    *) return ;;
    esac
    # The word after a flag that takes a value: the shell's default (files).
    local p=${prev#-}
    p=${p#-}
    if [[ $prev == -* && $prev != *=* && $valued == *" $p "* ]]; then
        return
    fi
    case $cur in
    --*=*) ;;
    --*|-) COMPREPLY=($(compgen -W "$flags" -- "$cur")) ;;
    -*) COMPREPLY=($(compgen -W "${flags//--/-}" -- "$cur")) ;;
    *) if [[ -n $words && $COMP_CWORD == 2 ]]; then COMPREPLY=($(compgen -W "$words" -- "$cur")); fi ;;
    esac
}
complete -o default -F _outbox outbox
`)
}

func zshCompletion(w io.Writer, specs []cmdSpec) {
	fmt.Fprintf(w, `#compdef outbox
# zsh completion for outbox %s, written by "outbox completion zsh".
_outbox() {
  local -a cmds args
  cmds=(
`, buildVersion())
	for _, s := range specs {
		fmt.Fprintf(w, "    %s\n", zshQuote(s.Name+":"+s.Short))
	}
	fmt.Fprint(w, `  )
  if (( CURRENT == 2 )); then
    _describe -t commands 'outbox command' cmds
    return
  fi
  local cmd=$words[2]
  shift words
  (( CURRENT-- ))
  case $cmd in
`)
	for _, s := range specs {
		fmt.Fprintf(w, "  %s)\n    args=(\n", s.Name)
		for _, f := range s.Flags {
			desc := "[" + zshBracket(f.Usage) + "]"
			if f.Value == "" {
				fmt.Fprintf(w, "      %s\n", zshQuote("--"+f.Name+desc))
				continue
			}
			action := " " // a number or a duration: nothing to complete
			if f.Value == "string" || strings.ToUpper(f.Value) == f.Value {
				action = "_files"
			}
			fmt.Fprintf(w, "      %s\n", zshQuote("--"+f.Name+"="+desc+":"+f.Value+":"+action))
		}
		if len(s.Words) > 0 {
			fmt.Fprintf(w, "      %s\n", zshQuote("1:"+s.Name+":("+strings.Join(s.Words, " ")+")"))
		} else {
			fmt.Fprintf(w, "      %s\n", zshQuote("*:file:_files"))
		}
		fmt.Fprint(w, "    ) ;;\n")
	}
	fmt.Fprint(w, `  *) return 1 ;;
  esac
  _arguments -S $args
}
if [[ $funcstack[1] == _outbox ]]; then
  _outbox "$@"
else
  compdef _outbox outbox
fi
`)
}

// zshQuote quotes s as one single-quoted zsh word.
func zshQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// zshBracket escapes s for the [explanation] of an _arguments spec.
func zshBracket(s string) string {
	return strings.NewReplacer(`\`, `\\`, `[`, `\[`, `]`, `\]`).Replace(s)
}
