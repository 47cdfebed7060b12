package render

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	htemplate "html/template"
	"io/fs"
	"slices"
	"strings"
	ttemplate "text/template"
)

//go:embed templates/*.tmpl
var embedded embed.FS

// Template file names. Each is parsed on its own except the partials,
// which are parsed together with every e-mail body of the same kind.
const (
	fileHTMLPartials  = "partials.email.html.tmpl"
	fileTextPartials  = "partials.email.txt.tmpl"
	fileDigestSubject = "your-week-digest.v1.email.subject.tmpl"
	fileDigestHTML    = "your-week-digest.v1.email.html.tmpl"
	fileDigestText    = "your-week-digest.v1.email.txt.tmpl"
	fileNudgeSubject  = "resurface-nudge.v1.email.subject.tmpl"
	fileNudgeHTML     = "resurface-nudge.v1.email.html.tmpl"
	fileNudgeText     = "resurface-nudge.v1.email.txt.tmpl"
	fileNudgeTitle    = "resurface-nudge.v1.push.title.tmpl"
	fileNudgeBody     = "resurface-nudge.v1.push.body.tmpl"
	fileReply         = "reply-text.v1.telegram.tmpl"
	fileDigestWeCom   = "your-week-digest.v1.wecom.md.tmpl"
	fileNudgeWeCom    = "resurface-nudge.v1.wecom.md.tmpl"
)

// templateFiles lists every template file, sorted.
var templateFiles = func() []string {
	names := []string{
		fileHTMLPartials, fileTextPartials,
		fileDigestSubject, fileDigestHTML, fileDigestText,
		fileNudgeSubject, fileNudgeHTML, fileNudgeText,
		fileNudgeTitle, fileNudgeBody, fileReply,
		fileDigestWeCom, fileNudgeWeCom,
	}
	slices.Sort(names)
	return names
}()

// TemplateNames returns the names of the embedded template files, sorted.
// A file with one of these names at the root of Options.Overrides replaces
// the embedded one. Files named *.email.html.tmpl are html/template; all
// others are text/template. The partials files define the blocks the
// e-mail bodies of their kind use ({{template "item" .}} and friends).
func TemplateNames() []string { return slices.Clone(templateFiles) }

// EmbeddedTemplate returns the embedded text of the template file name,
// for authors starting an override.
func EmbeddedTemplate(name string) ([]byte, error) {
	if !slices.Contains(templateFiles, name) {
		return nil, fmt.Errorf("render: no template named %q", name)
	}
	return embedded.ReadFile("templates/" + name)
}

// templates holds the parsed templates and where each file came from.
type templates struct {
	digestSubject, nudgeSubject *ttemplate.Template
	digestText, nudgeText       *ttemplate.Template
	nudgeTitle, nudgeBody       *ttemplate.Template
	reply                       *ttemplate.Template
	digestWeCom, nudgeWeCom     *ttemplate.Template
	digestHTML, nudgeHTML       *htemplate.Template
	// overridden records the files taken from Options.Overrides.
	overridden map[string]bool
}

// funcs are the functions every template may call.
var funcs = map[string]any{
	// tg escapes text for Telegram's HTML parse mode: only <, > and &.
	"tg": telegramEscape,
	// upper upper-cases text (plain-text headings).
	"upper": strings.ToUpper,
	// md and mdurl escape text and links for WeCom markdown.
	"md":    mdText,
	"mdurl": mdURL,
}

// loadTemplates reads and parses every template, taking a file from
// overrides when it has one of that name.
func loadTemplates(overrides fs.FS) (*templates, error) {
	src := map[string]string{}
	t := &templates{overridden: map[string]bool{}}
	for _, name := range templateFiles {
		b, err := embedded.ReadFile("templates/" + name)
		if err != nil {
			return nil, fmt.Errorf("render: embedded template %s: %w", name, err)
		}
		src[name] = string(b)
	}
	if overrides != nil {
		entries, err := fs.ReadDir(overrides, ".")
		if err != nil {
			return nil, fmt.Errorf("render: read template overrides: %w", err)
		}
		for _, ent := range entries {
			name := ent.Name()
			if strings.HasPrefix(name, ".") {
				continue
			}
			if ent.IsDir() || !slices.Contains(templateFiles, name) {
				return nil, fmt.Errorf("render: template override %q is not a template name (known: %s)", name, strings.Join(templateFiles, ", "))
			}
			b, err := fs.ReadFile(overrides, name)
			if err != nil {
				return nil, fmt.Errorf("render: read template override %s: %w", name, err)
			}
			src[name] = string(b)
			t.overridden[name] = true
		}
	}

	var errs []error
	text := func(files ...string) *ttemplate.Template {
		main := files[len(files)-1]
		root := ttemplate.New(main).Funcs(funcs).Option("missingkey=error")
		// Partials first, so that the main file may redefine their blocks.
		for _, f := range files[:len(files)-1] {
			if _, err := root.New(f).Parse(src[f]); err != nil {
				errs = append(errs, t.fileError(f, err))
				return nil
			}
		}
		if _, err := root.Parse(src[main]); err != nil {
			errs = append(errs, t.fileError(main, err))
			return nil
		}
		return root
	}
	html := func(files ...string) *htemplate.Template {
		main := files[len(files)-1]
		root := htemplate.New(main).Funcs(funcs).Option("missingkey=error")
		// Partials first, so that the main file may redefine their blocks.
		for _, f := range files[:len(files)-1] {
			if _, err := root.New(f).Parse(src[f]); err != nil {
				errs = append(errs, t.fileError(f, err))
				return nil
			}
		}
		if _, err := root.Parse(src[main]); err != nil {
			errs = append(errs, t.fileError(main, err))
			return nil
		}
		return root
	}
	t.digestSubject = text(fileDigestSubject)
	t.nudgeSubject = text(fileNudgeSubject)
	t.digestText = text(fileTextPartials, fileDigestText)
	t.nudgeText = text(fileTextPartials, fileNudgeText)
	t.nudgeTitle = text(fileNudgeTitle)
	t.nudgeBody = text(fileNudgeBody)
	t.reply = text(fileReply)
	t.digestWeCom = text(fileDigestWeCom)
	t.nudgeWeCom = text(fileNudgeWeCom)
	t.digestHTML = html(fileHTMLPartials, fileDigestHTML)
	t.nudgeHTML = html(fileHTMLPartials, fileNudgeHTML)
	if len(errs) > 0 {
		return nil, errors.Join(dedupe(errs)...)
	}
	return t, nil
}

// dedupe drops repeated errors (a broken partials file breaks two sets).
func dedupe(errs []error) []error {
	var out []error
	seen := map[string]bool{}
	for _, err := range errs {
		if !seen[err.Error()] {
			seen[err.Error()] = true
			out = append(out, err)
		}
	}
	return out
}

// origin says where a template file came from, for error messages.
func (t *templates) origin(file string) string {
	if t.overridden[file] {
		return "override"
	}
	return "embedded"
}

// fileError wraps a template error with the file name and origin.
func (t *templates) fileError(file string, err error) error {
	return fmt.Errorf("render: template %s (%s): %w", file, t.origin(file), err)
}

// execText runs the text template tpl (named by its main file) on data.
func (t *templates) execText(tpl *ttemplate.Template, data any) (string, error) {
	var b bytes.Buffer
	if err := tpl.ExecuteTemplate(&b, tpl.Name(), data); err != nil {
		return "", t.fileError(tpl.Name(), err)
	}
	return b.String(), nil
}

// execHTML runs the html template tpl (named by its main file) on data.
func (t *templates) execHTML(tpl *htemplate.Template, data any) (string, error) {
	var b bytes.Buffer
	if err := tpl.ExecuteTemplate(&b, tpl.Name(), data); err != nil {
		return "", t.fileError(tpl.Name(), err)
	}
	return b.String(), nil
}
