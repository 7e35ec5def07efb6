package doccheck

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
)

// root is the repository, from this package's directory.
const root = "../.."

// maxREADMELines bounds the README: what a newcomer needs first, and links
// to the guides for the rest.
const maxREADMELines = 300

const runnableMarker = "<!-- runnable -->"

// doc is one Markdown file, parsed as far as the checks need.
type doc struct {
	path     string // relative to root, slash-separated
	lines    []string
	anchors  map[string]bool
	links    []link
	snippets []snippet
}

type link struct {
	line   int
	target string
}

type snippet struct {
	line int // of the opening fence
	code string
}

var (
	headingRE    = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	linkRE       = regexp.MustCompile(`\[([^\]]*)\]\(([^)\s]+)\)`)
	inlineCodeRE = regexp.MustCompile("`[^`]*`")
)

// docs returns README.md and every docs/*.md.
func docs(t *testing.T) []*doc {
	t.Helper()
	paths := []string{"README.md"}
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range guides {
		paths = append(paths, "docs/"+filepath.Base(g))
	}
	var out []*doc
	for _, p := range paths {
		raw, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(p)))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, parse(t, p, string(raw)))
	}
	return out
}

// parse reads headings (as GitHub anchors), links and runnable snippets,
// outside fenced code blocks.
func parse(t *testing.T, path, text string) *doc {
	d := &doc{path: path, lines: strings.Split(strings.TrimRight(text, "\n"), "\n"), anchors: map[string]bool{}}
	seen := map[string]int{}
	fence, runnable := "", false
	var code []string
	start := 0
	for i, line := range d.lines {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if trimmed == "```" {
				if runnable {
					d.snippets = append(d.snippets, snippet{line: start + 1, code: strings.Join(code, "\n") + "\n"})
				}
				fence, runnable, code = "", false, nil
				continue
			}
			code = append(code, line)
			continue
		}
		if strings.HasPrefix(trimmed, "```") {
			fence, start = trimmed, i
			runnable = i > 0 && strings.TrimSpace(d.lines[i-1]) == runnableMarker
			if runnable && trimmed != "```go" {
				t.Errorf("%s:%d: %s is followed by %s, not a ```go block", path, i, runnableMarker, trimmed)
				runnable = false
			}
			continue
		}
		if trimmed == runnableMarker && (i+1 >= len(d.lines) || !strings.HasPrefix(strings.TrimSpace(d.lines[i+1]), "```")) {
			t.Errorf("%s:%d: %s is not right before a code block", path, i+1, runnableMarker)
		}
		if m := headingRE.FindStringSubmatch(line); m != nil {
			a := anchor(m[2])
			if n := seen[a]; n > 0 {
				d.anchors[fmt.Sprintf("%s-%d", a, n)] = true
			} else {
				d.anchors[a] = true
			}
			seen[a]++
		}
		for _, m := range linkRE.FindAllStringSubmatch(inlineCodeRE.ReplaceAllString(line, ""), -1) {
			d.links = append(d.links, link{line: i + 1, target: m[2]})
		}
	}
	if fence != "" {
		t.Errorf("%s:%d: code block never closed", path, start+1)
	}
	return d
}

// anchor is the id GitHub gives a heading: its text without markup,
// lower-cased, with spaces as hyphens and every character that is not a
// letter, a digit, a hyphen or an underscore dropped.
func anchor(heading string) string {
	heading = linkRE.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Every relative link of the README and the guides points at a file that
// exists, and every #anchor at a heading of its page.
func TestLinksResolve(t *testing.T) {
	all := docs(t)
	byPath := map[string]*doc{}
	for _, d := range all {
		byPath[d.path] = d
	}
	for _, d := range all {
		for _, l := range d.links {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(l.target, "#")
			target := d.path
			if file != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(d.path), file)))
				if strings.HasPrefix(target, "../") {
					t.Errorf("%s:%d: link %s leaves the repository", d.path, l.line, l.target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(target))); err != nil {
					t.Errorf("%s:%d: link %s: %s does not exist", d.path, l.line, l.target, target)
					continue
				}
			}
			if frag == "" {
				continue
			}
			td, ok := byPath[target]
			if !ok {
				t.Errorf("%s:%d: link %s: anchors are checked in README.md and docs/*.md only", d.path, l.line, l.target)
				continue
			}
			if !td.anchors[frag] {
				t.Errorf("%s:%d: link %s: %s has no heading #%s", d.path, l.line, l.target, target, frag)
			}
		}
	}
}

// The README stays what a newcomer reads first: at most 300 lines, linking
// every guide; every guide shows at least one runnable snippet.
func TestREADMEShortAndGuidesLinked(t *testing.T) {
	all := docs(t)
	readme := all[0]
	if n := len(readme.lines); n > maxREADMELines {
		t.Errorf("README.md has %d lines; keep it to %d and move the rest into a guide under docs/", n, maxREADMELines)
	}
	linked := map[string]bool{}
	for _, l := range readme.links {
		file, _, _ := strings.Cut(l.target, "#")
		linked[filepath.ToSlash(filepath.Clean(file))] = true
	}
	if len(all) < 2 {
		t.Fatal("no guide under docs/")
	}
	for _, d := range all[1:] {
		if !linked[d.path] {
			t.Errorf("README.md does not link %s", d.path)
		}
		if len(d.snippets) == 0 {
			t.Errorf("%s has no runnable snippet (a ```go block right after %s)", d.path, runnableMarker)
		}
	}
}

// goCmd runs the go command in this package's directory, within the
// repository's module, offline and without touching go.mod.
func goCmd(ctx context.Context, args ...string) ([]byte, error) {
	goBin := "go"
	if r := os.Getenv("GOROOT"); r != "" {
		if _, err := os.Stat(filepath.Join(r, "bin", "go")); err == nil {
			goBin = filepath.Join(r, "bin", "go")
		}
	}
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN=local", "GOFLAGS=-mod=readonly", "GOPROXY=off")
	return cmd.CombinedOutput()
}

// wantOutput returns the lines after a snippet's "// Output:" comment, and
// whether it has one.
func wantOutput(code string) ([]string, bool) {
	var out []string
	found := false
	sc := bufio.NewScanner(strings.NewReader(code))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "// Output:":
			found, out = true, nil
		case found && strings.HasPrefix(line, "//"):
			out = append(out, strings.TrimSpace(strings.TrimPrefix(line, "//")))
		case found:
			return out, true
		}
	}
	return out, found
}

// Every snippet marked runnable compiles as the file it is, inside this
// repository's module (go vet: type-checked and vetted); those that state
// their output run, against nothing, and print it.
func TestRunnableSnippetsBuildAndRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every runnable snippet")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// A directory whose name starts with "_" is one the go command's
	// ./... patterns pass over, so that a run of go vet ./... or go test
	// ./... beside this test never sees the snippets.
	dir, err := os.MkdirTemp(".", "_snippets")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	type built struct {
		where string
		pkg   string
		want  []string
		run   bool
	}
	var all []built
	for _, d := range docs(t) {
		for _, s := range d.snippets {
			where := fmt.Sprintf("%s:%d", d.path, s.line)
			name := fmt.Sprintf("s%02d", len(all))
			file := "main.go"
			if !strings.HasPrefix(s.code, "package main\n") {
				if !strings.HasPrefix(s.code, "package ") {
					t.Errorf("%s: a runnable snippet is a whole Go file: it starts with its package clause", where)
					continue
				}
				file = "snippet_test.go"
			}
			if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name, file), []byte(s.code), 0o644); err != nil {
				t.Fatal(err)
			}
			want, run := wantOutput(s.code)
			all = append(all, built{where: where, pkg: "./" + filepath.ToSlash(filepath.Join(dir, name)), want: want, run: run && file == "main.go"})
		}
	}
	if len(all) == 0 {
		t.Fatal("no runnable snippet in README.md or docs/")
	}
	var pkgs []string
	for _, b := range all {
		pkgs = append(pkgs, b.pkg)
	}
	if out, err := goCmd(ctx, append([]string{"vet"}, pkgs...)...); err != nil {
		// Name each failing snippet by its place in the docs.
		msg := string(out)
		for _, b := range all {
			msg = strings.ReplaceAll(msg, strings.TrimPrefix(b.pkg, "./"), b.where)
		}
		t.Fatalf("go vet of the runnable snippets: %v\n%s", err, msg)
	}
	ran := 0
	for _, b := range all {
		if !b.run {
			continue
		}
		ran++
		out, err := goCmd(ctx, "run", b.pkg)
		if err != nil {
			t.Errorf("%s: go run: %v\n%s", b.where, err, out)
			continue
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(string(bytes.TrimSpace(out))), "\n") {
			got = append(got, strings.TrimSpace(l))
		}
		if !slices.Equal(got, b.want) {
			t.Errorf("%s printed:\n%s\nwant (its // Output: comment):\n%s", b.where, strings.Join(got, "\n"), strings.Join(b.want, "\n"))
		}
	}
	t.Logf("%d runnable snippets vetted, %d of them run", len(all), ran)
}
