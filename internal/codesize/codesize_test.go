package codesize

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The limits: lines per non-test Go file, and lines per function, from its
// func line to its closing brace inclusive.
const (
	maxFileLines = 600
	maxFuncLines = 80
)

// modulePath is the module whose root the walk starts from.
const modulePath = "github.com/kscope-dev/kscope"

// source is one non-test Go file of the repository.
type source struct {
	rel   string // relative to the module root, slash-separated
	lines int
	fset  *token.FileSet
	file  *ast.File
}

// moduleRoot returns the root of modulePath: the nearest directory, from
// the test's working directory up, whose go.mod declares it.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if declaresModule(filepath.Join(dir, "go.mod")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod of module %s above the working directory", modulePath)
		}
		dir = parent
	}
}

// declaresModule reports whether the go.mod at path declares modulePath
// (and not a module nested in it, such as its bench module).
func declaresModule(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "//")
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`+"`") == modulePath
		}
	}
	return false
}

// sources parses every non-test Go file under the module root, nested
// modules included, skipping testdata, hidden and _-prefixed directories and the root's
// bin/ directory.
func sources(t *testing.T) []source {
	t.Helper()
	root := moduleRoot(t)
	var out []source
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || path == filepath.Join(root, "bin")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("parsing %s: %w", rel, err)
		}
		out = append(out, source{rel: filepath.ToSlash(rel), lines: lineCount(src), fset: fset, file: f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no Go file under %s", root)
	}
	return out
}

// lineCount counts the lines of src, the last one whether or not it ends
// in a newline.
func lineCount(src []byte) int {
	n := bytes.Count(src, []byte("\n"))
	if len(src) > 0 && src[len(src)-1] != '\n' {
		n++
	}
	return n
}

// A non-test Go file is at most maxFileLines long: a longer one is split
// by concern.
func TestFileLength(t *testing.T) {
	var over []string
	for _, s := range sources(t) {
		if s.lines > maxFileLines {
			over = append(over, fmt.Sprintf("%s:1: %d lines", s.rel, s.lines))
		}
	}
	for _, o := range over {
		t.Errorf("%s, over %d", o, maxFileLines)
	}
	if len(over) > 0 {
		t.Logf("%d files over %d lines: split each by concern", len(over), maxFileLines)
	}
}

// A function declared in a non-test Go file is at most maxFuncLines long,
// from its func line to its closing brace: a longer one is split by what
// it does.
func TestFunctionLength(t *testing.T) {
	var over []string
	for _, s := range sources(t) {
		for _, decl := range s.file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			start := s.fset.Position(fn.Pos()).Line
			n := s.fset.Position(fn.Body.Rbrace).Line - start + 1
			if n > maxFuncLines {
				over = append(over, fmt.Sprintf("%s:%d: %s is %d lines", s.rel, start, funcName(fn), n))
			}
		}
	}
	for _, o := range over {
		t.Errorf("%s, over %d", o, maxFuncLines)
	}
	if len(over) > 0 {
		t.Logf("%d functions over %d lines: split each by what it does, each step a function with a name and a doc comment", len(over), maxFuncLines)
	}
}

// funcName names fn as a reader looks it up: F, or T.M for a method.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	for {
		switch x := typ.(type) {
		case *ast.StarExpr:
			typ = x.X
			continue
		case *ast.IndexExpr: // a generic type's method: T[P]
			typ = x.X
			continue
		case *ast.IndexListExpr:
			typ = x.X
			continue
		case *ast.Ident:
			return x.Name + "." + fn.Name.Name
		}
		return fn.Name.Name
	}
}
