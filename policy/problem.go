package policy

import (
	"fmt"
	"strings"
)

// Problem is one thing wrong with a policy file: where it is and what to
// change.
type Problem struct {
	// File is the file's path (Load's path, Parse's name).
	File string
	// Line is the line of the field at fault, or of the nearest enclosing
	// one (0 when unknown: a File built in code).
	Line int
	// Consumer is the consumer group at fault ("" for the file as a
	// whole); an entry without a group is named by its place, such as
	// "consumers[2]".
	Consumer string
	// Field is the field's path inside its entry, such as
	// "failures.ladder" ("" for the entry or the file as a whole).
	Field string
	// Reason says what is wrong and what to change.
	Reason string
}

// Error returns the problem as one line:
// "FILE:LINE: consumer GROUP: FIELD: REASON".
func (p Problem) Error() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.File == "" {
		b.WriteString("policy")
	}
	if p.Line > 0 {
		fmt.Fprintf(&b, ":%d", p.Line)
	}
	b.WriteString(": ")
	if p.Consumer != "" {
		b.WriteString("consumer " + p.Consumer + ": ")
	}
	if p.Field != "" {
		b.WriteString(p.Field + ": ")
	}
	b.WriteString(p.Reason)
	return b.String()
}

// Error is what Load, Parse and File.Validate return for a file that is
// not valid: every problem found, in the file's order.
type Error struct {
	Problems []Problem
}

// Error returns the problems, one a line.
func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.Error()
	}
	return strings.Join(lines, "\n")
}

// problems collects a file's problems.
type problems struct {
	file  string
	index *index
	list  []Problem
}

// add records a problem of entry consumer (-1: the file) at field path,
// named group ("" for an entry without one).
func (ps *problems) add(consumer int, group, path, format string, args ...any) {
	p := Problem{File: ps.file, Consumer: group, Field: path, Reason: fmt.Sprintf(format, args...)}
	if consumer >= 0 && group == "" {
		p.Consumer = fmt.Sprintf("consumers[%d]", consumer)
	}
	p.Line = ps.index.line(consumer, path)
	ps.list = append(ps.list, p)
}

// err returns the problems as an *Error, or nil when there are none.
func (ps *problems) err() error {
	if len(ps.list) == 0 {
		return nil
	}
	return &Error{Problems: ps.list}
}
