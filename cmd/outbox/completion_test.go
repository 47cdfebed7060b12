package main

import (
	"flag"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func completionScript(t *testing.T, shell string) string {
	t.Helper()
	code, out, errOut := runCLI(t, "", "completion", shell)
	if code != exitOK || errOut != "" {
		t.Fatalf("completion %s: exit %d, stderr %q", shell, code, errOut)
	}
	return out
}

// bashComplete sources the script and returns what _outbox offers for
// line, completed at its end (a trailing space starts a new word).
func bashComplete(t *testing.T, script, line string) []string {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash is needed to test the bash completion: %v", err)
	}
	p := writeTemp(t, "outbox.bash", script)
	words := strings.Fields(line)
	if strings.HasSuffix(line, " ") {
		words = append(words, "")
	}
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = "'" + w + "'"
	}
	prog := "source " + p + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" + strconv.Itoa(len(words)-1) +
		"\n_outbox\nprintf '%s\\n' \"${COMPREPLY[@]}\"\ncomplete -p outbox >&2\n"
	cmd := exec.Command(bash, "--norc", "--noprofile", "-c", prog)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, stderr.String())
	}
	if got := strings.TrimSpace(stderr.String()); got != "complete -o default -F _outbox outbox" {
		t.Fatalf("the script registers %q", got)
	}
	return strings.Fields(string(out))
}

func TestCompletion_BashSyntax(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatalf("bash is needed to test the bash completion: %v", err)
	}
	p := writeTemp(t, "outbox.bash", completionScript(t, "bash"))
	if out, err := exec.Command(bash, "-n", p).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
}

func TestCompletion_BashCompletes(t *testing.T) {
	script := completionScript(t, "bash")
	for _, c := range []struct {
		line string
		want []string // exactly, in order
	}{
		{"outbox se", []string{"serve"}},
		{"outbox v", []string{"validate", "vapid-keys", "version"}},
		{"outbox serve --ad", []string{"--addr"}},
		{"outbox serve -ad", []string{"-addr"}},
		{"outbox serve --no-s", []string{"--no-sink"}},
		{"outbox resolve ID --a", []string{"--all", "--as"}}, // flags after an argument too
		{"outbox serve --data ", nil},                        // a flag's value: files, the shell's default
		{"outbox serve --addr=127", nil},                     // likewise
		{"outbox help ser", []string{"serve"}},               // help's argument is a command
		{"outbox completion ", []string{"bash", "zsh"}},
		{"outbox consent ", []string{"show", "set", "lift"}},
		{"outbox consent s", []string{"show", "set"}},
		{"outbox suppressions l", []string{"list", "lift"}},
		{"outbox consent show ", nil}, // the user: nothing to offer
		{"outbox validate ", nil},     // files
		{"outbox nosuch --", nil},
	} {
		got := bashComplete(t, script, c.line)
		if strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("%q completes to %q, want %q", c.line, got, c.want)
		}
	}
	// Every flag of a command, from its own flag set.
	got := bashComplete(t, script, "outbox compact --")
	if strings.Join(got, " ") != "--data --database-schema --database-url --log-rewrite-min --retention" {
		t.Errorf("compact's flags: %q", got)
	}
}

// TestCompletion_EveryCommandAndFlag: both scripts hold every command of
// the table and every flag each command's flag set defines.
func TestCompletion_EveryCommandAndFlag(t *testing.T) {
	bash, zsh := completionScript(t, "bash"), completionScript(t, "zsh")
	for name, c := range commands {
		fs := commandFlags(c)
		if fs == nil {
			t.Errorf("%s: no flag set handed over (it must parse with parseFlags)", name)
			continue
		}
		var flags []string
		fs.VisitAll(func(f *flag.Flag) {
			flags = append(flags, "--"+f.Name)
			if !strings.Contains(zsh, "'--"+f.Name+"[") && !strings.Contains(zsh, "'--"+f.Name+"=[") {
				t.Errorf("zsh: %s --%s missing", name, f.Name)
			}
		})
		if want := "    " + name + ") flags='" + strings.Join(flags, " ") + "'"; !strings.Contains(bash, want) {
			t.Errorf("bash lacks %q", want)
		}
		if !strings.Contains(zsh, "    '"+name+":") || !strings.Contains(zsh, "\n  "+name+")\n") {
			t.Errorf("zsh: command %s missing", name)
		}
	}
	if len(commands) < 20 {
		t.Fatalf("only %d commands in the table", len(commands))
	}
}

// TestCompletion_Zsh: zsh -n when zsh is installed; the script's shape
// otherwise (the commands are checked above).
func TestCompletion_Zsh(t *testing.T) {
	script := completionScript(t, "zsh")
	if zsh, err := exec.LookPath("zsh"); err == nil {
		p := writeTemp(t, "_outbox", script)
		if out, err := exec.Command(zsh, "-n", p).CombinedOutput(); err != nil {
			t.Fatalf("zsh -n: %v\n%s", err, out)
		}
	}
	for _, want := range []string{
		"#compdef outbox\n",
		"_describe -t commands 'outbox command' cmds",
		"'--addr=[HTTP listen address (port 0 picks a free one) (env OUTBOX_ADDR)]:string:_files'",
		"'--lease=[lease of a claimed delivery (env OUTBOX_LEASE)]:duration: '",
		"'--no-sink[leave channels without a provider pending instead of writing them to the sink (env OUTBOX_NO_SINK)]'",
		"'1:completion:(bash zsh)'",
		"_arguments -S $args\n",
		"compdef _outbox outbox\n",
	} {
		if !strings.Contains(script, want) {
			t.Errorf("the zsh script lacks %q", want)
		}
	}
	// An escaped quote inside a quoted word is '\'' (zshQuote).
	if strings.Count(strings.ReplaceAll(script, `'\''`, ""), "'")%2 != 0 {
		t.Error("the zsh script has an unbalanced single quote")
	}
}

func TestCompletion_Usage(t *testing.T) {
	for _, args := range [][]string{{"completion"}, {"completion", "fish"}, {"completion", "bash", "zsh"}} {
		if code, _, errOut := runCLI(t, "", args...); code != exitUsage || !strings.Contains(errOut, "bash or zsh") {
			t.Errorf("%q: exit %d, stderr %q", args, code, errOut)
		}
	}
}
