// Package doccheck has no code of its own: its tests keep README.md and the
// guides under docs/ honest. Every relative link and #anchor must resolve
// (anchors as GitHub renders headings), the README must stay short and link
// every guide, and every snippet marked runnable must build — and run, with
// the output it states, when it ends in an "// Output:" comment.
//
// A runnable snippet is a whole Go file in a ```go block right after the
// line <!-- runnable -->. A file whose package is main is built (go vet);
// one of another package is vetted as a test file. A main package whose
// last comment is "// Output:" followed by comment lines is also run with
// go run, against nothing (no broker, no database), and must print those
// lines.
package doccheck
