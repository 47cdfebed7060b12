package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outboxhq/outbox/envelope"
	"github.com/outboxhq/outbox/render"
)

func init() {
	register(&command{
		Name:  "render",
		Short: "show what an envelope file becomes (.html, .txt, .eml, .json) for template authors",
		Run:   runRender,
	})
}

const renderUsage = `Usage: outbox render FILE... [flags]

Renders each envelope in FILE (one envelope, a JSON array or JSON Lines;
"-" is stdin) the way the worker would, after validating it. Without --out
it prints a summary; with --out DIR it writes, per envelope:

  email     NAME.email.html, NAME.email.txt, NAME.email.eml (RFC 5322,
            multipart/alternative: open it in a mail client)
  push      NAME.push.json (TTL, urgency, topic and the exact payload)
  telegram  NAME.telegram.txt (every segment) and NAME.telegram.json

and an index.html linking every file in DIR. NAME is the file name without
.json (with -N appended when the file holds several envelopes).

--channel renders on another channel than the envelope's own (a push
nudge as e-mail, say); a recipient or unsubscribe_ref the other channel
needs is filled with a placeholder.

The --brand-* flags (and their OUTBOX_BRAND_* variables) are serve's:
preview the product name, sender, colour, logo, postal address and
preferences link as users will get them (docs/branding.md).

Flags:
`

// renderFlags are the flags of "outbox render".
type renderFlags struct {
	channel, out, baseURL, from, templates, now string
	brand                                       *brandFlags
}

func runRender(ctx context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	var f renderFlags
	fs.StringVar(&f.channel, "channel", "", "render on this channel instead of the envelope's: email, push, telegram or wecom")
	fs.StringVar(&f.out, "out", "", "write the rendered files into this directory (created if missing) instead of printing a summary")
	fs.StringVar(&f.baseURL, "base-url", envOr(e, "OUTBOX_PUBLIC_URL", render.DefaultBaseURL), "public base URL of unsubscribe links (env OUTBOX_PUBLIC_URL)")
	fs.StringVar(&f.from, "from", envOr(e, "OUTBOX_EMAIL_FROM", sinkFromAddress), "From of the .eml files, with the display name of --brand-sender (env OUTBOX_EMAIL_FROM)")
	fs.StringVar(&f.templates, "templates", envOr(e, "OUTBOX_TEMPLATES", ""), "directory of template overrides (env OUTBOX_TEMPLATES)")
	f.brand = addBrandFlags(&settings{fs: fs, e: e}) // as serve has them
	fs.StringVar(&f.now, "now", "", "render time, RFC 3339 (default: the envelope's not_before, else its created_at, else now)")
	fs.Usage = func() { fmt.Fprint(fs.Output(), renderUsage); fs.PrintDefaults() }

	if code, done := parseFlags(fs, e, args); done {
		return code
	}
	files := fs.Args()
	if len(files) == 0 {
		fmt.Fprintln(e.Stderr, "Error: no envelope file given\nTry: outbox help render")
		return exitUsage
	}
	var channel envelope.Channel
	if f.channel != "" {
		channel = envelope.Channel(f.channel)
		if !channel.Valid() {
			fmt.Fprintf(e.Stderr, "Error: --channel %q is not one of email, push, telegram, wecom\nTry: outbox help render\n", f.channel)
			return exitUsage
		}
	}
	var now time.Time
	if f.now != "" {
		t, err := time.Parse(time.RFC3339, f.now)
		if err != nil {
			fmt.Fprintf(e.Stderr, "Error: --now %q is not an RFC 3339 time\nTry: outbox help render\n", f.now)
			return exitUsage
		}
		now = t
	}

	brand, err := f.brand.brand()
	if err != nil {
		fmt.Fprintf(e.Stderr, "Error: %v\nTry: outbox help render\n", err)
		return exitUsage
	}
	if f.from, err = brand.SenderAddress(f.from); err != nil {
		fmt.Fprintf(e.Stderr, "Error: --from (OUTBOX_EMAIL_FROM) is not an e-mail address like news@example.org\nTry: outbox help render\n")
		return exitUsage
	}
	opts := &render.Options{BaseURL: f.baseURL, Brand: brand}
	if f.templates != "" {
		if st, err := os.Stat(f.templates); err != nil || !st.IsDir() {
			return fail(e, "--templates %s is not a directory", f.templates)
		}
		opts.Overrides = os.DirFS(f.templates)
	}
	r, err := render.New(opts)
	if err != nil {
		return fail(e, "%v", err)
	}
	if f.out != "" {
		if err := os.MkdirAll(f.out, 0o755); err != nil {
			return fail(e, "create --out directory: %v", err)
		}
	}

	code := exitOK
	for _, file := range files {
		if ctx.Err() != nil {
			return exitFailure
		}
		if !renderFile(e, r, &f, file, channel, now) {
			code = exitFailure
		}
	}
	if f.out != "" {
		if err := writeIndex(f.out); err != nil {
			return fail(e, "write index: %v", err)
		}
		if code == exitOK {
			fmt.Fprintf(e.Stdout, "open %s\n", filepath.Join(f.out, "index.html"))
		}
	}
	return code
}

// renderFile renders every envelope of file; it reports problems on
// stderr and returns false when any envelope failed.
func renderFile(e *env, r *render.Renderer, f *renderFlags, file string, channel envelope.Channel, now time.Time) bool {
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(e.Stdin)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		fmt.Fprintf(e.Stderr, "Error: %v\n", err)
		return false
	}
	inputs, err := envelope.SplitInput(data)
	if err != nil {
		fmt.Fprintf(e.Stderr, "%s:%v\n", file, err)
		return false
	}
	if len(inputs) == 0 {
		fmt.Fprintf(e.Stderr, "%s: no envelope\n", file)
		return false
	}
	stem := strings.TrimSuffix(filepath.Base(file), ".json")
	if file == "-" {
		stem = "stdin"
	}
	ok := true
	for i, in := range inputs {
		ev, err := envelope.Parse(in.Data)
		if err != nil {
			var ve *envelope.ValidationError
			if errors.As(err, &ve) {
				for _, p := range ve.Problems {
					fmt.Fprintf(e.Stderr, "%s:%d: %s\n", file, in.Line, p)
				}
			} else {
				fmt.Fprintf(e.Stderr, "%s:%d: %v\n", file, in.Line, err)
			}
			ok = false
			continue
		}
		name := stem
		if len(inputs) > 1 {
			name += "-" + strconv.Itoa(i+1)
		}
		where := fmt.Sprintf("%s:%d", file, in.Line)
		if channel != "" && channel != ev.Channel {
			for _, note := range retarget(ev, channel) {
				fmt.Fprintf(e.Stderr, "note: %s: %s\n", where, note)
			}
		}
		at := now
		if at.IsZero() {
			at = defaultRenderTime(ev)
		}
		if err := renderEnvelope(e, r, f, where, name, ev, at); err != nil {
			fmt.Fprintf(e.Stderr, "%s: %v\n", where, err)
			ok = false
		}
	}
	return ok
}

// defaultRenderTime is the envelope's not_before, else its created_at,
// else the current time.
func defaultRenderTime(ev *envelope.Envelope) time.Time {
	switch {
	case !ev.NotBefore.IsZero():
		return ev.NotBefore
	case !ev.CreatedAt.IsZero():
		return ev.CreatedAt
	}
	return time.Now().UTC()
}

// Placeholders used when an envelope is rendered on another channel.
const (
	placeholderEmail       = "recipient@example.invalid"
	placeholderUnsubscribe = "preview"
	placeholderChatID      = "0"
	placeholderEndpoint    = "https://push.example.invalid/preview"
	placeholderWeComUser   = "preview"
)

// retarget moves ev to channel ch, filling what ch needs with
// placeholders; it returns notes saying what was filled.
func retarget(ev *envelope.Envelope, ch envelope.Channel) []string {
	notes := []string{fmt.Sprintf("rendering a %s envelope on %s", ev.Channel, ch)}
	ev.Channel = ch
	switch ch {
	case envelope.ChannelEmail:
		if ev.Recipient.Email == "" {
			ev.Recipient.Email = placeholderEmail
			notes = append(notes, "recipient.email is a placeholder: "+placeholderEmail)
		}
		if ev.ConsentSnapshot.UnsubscribeRef == "" {
			ev.ConsentSnapshot.UnsubscribeRef = placeholderUnsubscribe
			notes = append(notes, "consent_snapshot.unsubscribe_ref is a placeholder: "+placeholderUnsubscribe)
		}
	case envelope.ChannelPush:
		if ev.Recipient.PushSubscription == nil {
			ev.Recipient.PushSubscription = &envelope.PushSubscription{Endpoint: placeholderEndpoint}
			notes = append(notes, "recipient.push_subscription is a placeholder")
		}
	case envelope.ChannelTelegram:
		if ev.Recipient.ChatID == "" {
			ev.Recipient.ChatID = placeholderChatID
			notes = append(notes, "recipient.chat_id is a placeholder: "+placeholderChatID)
		}
	case envelope.ChannelWeCom:
		if ev.Recipient.WeComUser == "" {
			ev.Recipient.WeComUser = placeholderWeComUser
			notes = append(notes, "recipient.wecom_user is a placeholder: "+placeholderWeComUser)
		}
	}
	return notes
}

// renderEnvelope renders every segment of ev and prints a summary or
// writes the files.
func renderEnvelope(e *env, r *render.Renderer, f *renderFlags, where, name string, ev *envelope.Envelope, at time.Time) error {
	n := render.Segments(ev)
	if n == 0 {
		return errors.New("nothing to render (the reply text is blank)")
	}
	msgs := make([]*envelope.Message, n)
	for i := range n {
		m, err := r.Render(ev, i, at)
		if err != nil {
			return err
		}
		msgs[i] = m
	}
	base := name + "." + string(ev.Channel)
	files := map[string][]byte{}
	switch ev.Channel {
	case envelope.ChannelEmail:
		m := msgs[0].Email
		key := envelope.Key{Tenant: ev.Tenant(), EnvelopeID: ev.ID}
		files[base+".html"] = []byte(m.HTML)
		files[base+".txt"] = []byte(m.Text)
		files[base+".eml"] = render.EML(m, f.from, at, key.Hash()+"@outbox")
		if f.out == "" {
			fmt.Fprintf(e.Stdout, "%s: %s on email\n", where, ev.Template)
			fmt.Fprintf(e.Stdout, "  subject: %s\n", m.Subject)
			for _, h := range m.Headers {
				fmt.Fprintf(e.Stdout, "  %s: %s\n", h.Name, h.Value)
			}
			if !hasHeader(m.Headers, render.HeaderListUnsubscribePost) {
				fmt.Fprintf(e.Stdout, "  (no %s: the unsubscribe URL is not https; see --base-url)\n", render.HeaderListUnsubscribePost)
			}
			fmt.Fprintf(e.Stdout, "  html: %d bytes, text: %d bytes\n", len(m.HTML), len(m.Text))
		}
	case envelope.ChannelPush:
		b, err := render.PreviewJSON(msgs[0])
		if err != nil {
			return err
		}
		files[base+".json"] = b
		if f.out == "" {
			p := msgs[0].Push
			fmt.Fprintf(e.Stdout, "%s: %s on push\n", where, ev.Template)
			fmt.Fprintf(e.Stdout, "  ttl: %s, urgency: %s, topic: %s, payload: %d bytes\n", p.TTL, p.Urgency, p.Topic, len(p.Payload))
			fmt.Fprintf(e.Stdout, "  payload: %s\n", p.Payload)
		}
	case envelope.ChannelTelegram:
		var txt, js bytes.Buffer
		js.WriteString("[\n")
		if f.out == "" {
			fmt.Fprintf(e.Stdout, "%s: %s on telegram, %d segment(s)\n", where, ev.Template, n)
		}
		for i, m := range msgs {
			b, err := render.PreviewJSON(m)
			if err != nil {
				return err
			}
			if i > 0 {
				js.WriteString(",\n")
			}
			js.Write(bytes.TrimSuffix(b, []byte("\n")))
			visible, _ := render.TelegramVisibleText(m.Chat.Text) // checked by PreviewJSON
			units := envelope.UTF16Len(visible)
			fmt.Fprintf(&txt, "=== segment %d/%d · %d characters as Telegram counts · parse_mode %s ===\n%s\n",
				i+1, n, units, m.Chat.ParseMode, m.Chat.Text)
			if f.out == "" {
				fmt.Fprintf(e.Stdout, "  segment %d/%d: %d characters, begins %q\n", i+1, n, units, firstWords(visible, 8))
			}
		}
		js.WriteString("\n]\n")
		files[base+".txt"] = txt.Bytes()
		files[base+".json"] = js.Bytes()
	case envelope.ChannelWeCom, envelope.ChannelWeComRobot, envelope.ChannelWeComBotReply:
		var txt, js bytes.Buffer
		js.WriteString("[\n")
		if f.out == "" {
			fmt.Fprintf(e.Stdout, "%s: %s on %s, %d segment(s)\n", where, ev.Template, ev.Channel, n)
		}
		for i, m := range msgs {
			b, err := render.PreviewJSON(m)
			if err != nil {
				return err
			}
			if i > 0 {
				js.WriteString(",\n")
			}
			js.Write(bytes.TrimSuffix(b, []byte("\n")))
			fmt.Fprintf(&txt, "=== segment %d/%d · %d bytes · msgtype %s ===\n%s\n", i+1, n, len(m.WeCom.Content), m.WeCom.MsgType, m.WeCom.Content)
			if f.out == "" {
				fmt.Fprintf(e.Stdout, "  segment %d/%d: %s, %d bytes, begins %q\n", i+1, n, m.WeCom.MsgType, len(m.WeCom.Content), firstWords(m.WeCom.Content, 8))
			}
		}
		js.WriteString("\n]\n")
		files[base+".txt"] = txt.Bytes()
		files[base+".json"] = js.Bytes()
	}
	if f.out == "" {
		return nil
	}
	names := make([]string, 0, len(files))
	for fn := range files {
		names = append(names, fn)
	}
	slices.Sort(names)
	for _, fn := range names {
		path := filepath.Join(f.out, fn)
		if err := os.WriteFile(path, files[fn], 0o644); err != nil {
			return err
		}
		fmt.Fprintln(e.Stdout, path)
	}
	return nil
}

// hasHeader reports whether hs has a header named name.
func hasHeader(hs []envelope.Header, name string) bool {
	for _, h := range hs {
		if strings.EqualFold(h.Name, name) {
			return true
		}
	}
	return false
}

// firstWords returns the first n words of s.
func firstWords(s string, n int) string {
	w := strings.Fields(s)
	if len(w) > n {
		return strings.Join(w[:n], " ") + " …"
	}
	return strings.Join(w, " ")
}

// indexPage lists the rendered files of a preview directory.
var indexPage = template.Must(template.New("index").Parse(`<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><meta name="color-scheme" content="light dark"><title>outbox render preview</title></head>
<body style="font-family:system-ui,sans-serif;max-width:760px;margin:2em auto;padding:0 1em;line-height:1.5">
<h1>outbox render preview</h1>
<p>What each envelope becomes, as written by <code>outbox render --out</code>. Open the <code>.eml</code> files in a mail client.</p>
{{range .}}<h2>{{.Name}}</h2>
<ul>{{range .Files}}<li><a href="{{.}}">{{.}}</a></li>{{end}}</ul>
{{end}}</body>
</html>
`))

// writeIndex writes DIR/index.html linking every rendered file in DIR,
// grouped by envelope and channel.
func writeIndex(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	type group struct {
		Name  string
		Files []string
	}
	var groups []*group
	byName := map[string]*group{}
	for _, ent := range entries {
		fn := ent.Name()
		ext := filepath.Ext(fn)
		if ent.IsDir() || fn == "index.html" || !slices.Contains([]string{".html", ".txt", ".eml", ".json"}, ext) {
			continue
		}
		g := byName[strings.TrimSuffix(fn, ext)]
		if g == nil {
			g = &group{Name: strings.TrimSuffix(fn, ext)}
			byName[g.Name] = g
			groups = append(groups, g)
		}
		g.Files = append(g.Files, fn)
	}
	var b bytes.Buffer
	if err := indexPage.Execute(&b, groups); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "index.html"), b.Bytes(), 0o644)
}
