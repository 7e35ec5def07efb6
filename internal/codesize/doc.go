// Package codesize has no code of its own: its tests keep the repository's
// Go code in pieces a reader takes in at once. Every non-test Go file of
// every module in the repository (the library, integration, bench, the
// examples, the CLI, kscopetest/containers) must be at most 600 lines
// long, and every function declared in one at most 80 lines, from its func
// line to its closing brace. A longer function is split by what it does,
// each step a function with a name and a doc comment; a longer file is
// split by concern.
//
// The tests walk the repository from the root of the
// github.com/kscope-dev/kscope module, skipping testdata, hidden
// directories and bin/, and name each offender with its file, line and
// length.
package codesize
