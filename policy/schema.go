package policy

import _ "embed"

//go:embed schema.json
var schema []byte

// Schema returns the policy file's JSON Schema (draft 2020-12), for
// editors: with the YAML language server, a file's first line
// "# yaml-language-server: $schema=<path or URL of schema.json>" turns on
// completion and checks as you type. kscope policy schema prints it. Load
// checks more than the schema can say (the library's own checks, such as a
// ladder that must increase).
func Schema() []byte { return append([]byte(nil), schema...) }
