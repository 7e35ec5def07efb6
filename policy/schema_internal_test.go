package policy

import (
	"encoding/json"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// node is a schema (sub)object.
type node map[string]any

// resolve follows a $ref into $defs.
func (n node) resolve(t *testing.T, root node) node {
	t.Helper()
	ref, ok := n["$ref"].(string)
	if !ok {
		return n
	}
	def, ok := root["$defs"].(map[string]any)[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
	if !ok {
		t.Fatalf("$ref %s does not resolve", ref)
	}
	return node(def)
}

func strs(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

// The JSON Schema says what the Go types decode: the same fields, the same
// required ones, the same kinds and enums, no other field; so it cannot
// drift from them.
func TestSchemaMatchesTheGoTypes(t *testing.T) {
	var root node
	if err := json.Unmarshal(Schema(), &root); err != nil {
		t.Fatalf("schema.json is not JSON: %v", err)
	}
	checkStruct(t, root, root, reflect.TypeFor[File](), "file")
	version := root["properties"].(map[string]any)["version"].(map[string]any)
	if version["const"] != float64(FormatVersion) {
		t.Fatalf("the schema's version is %v, the format's %d", version["const"], FormatVersion)
	}
}

func checkStruct(t *testing.T, root, n node, typ reflect.Type, where string) {
	t.Helper()
	if n["type"] != "object" || n["additionalProperties"] != false {
		t.Errorf("%s: want type object with additionalProperties false, got %v, %v", where, n["type"], n["additionalProperties"])
	}
	props, _ := n["properties"].(map[string]any)
	var names, req []string
	for _, sf := range reflect.VisibleFields(typ) {
		name := yamlName(sf)
		if name == "" {
			continue
		}
		names = append(names, name)
		if sf.Tag.Get("policy") == "required" {
			req = append(req, name)
		}
		p, ok := props[name].(map[string]any)
		if !ok {
			t.Errorf("%s: field %s is not in the schema", where, name)
			continue
		}
		checkValue(t, root, node(p), sf.Type, where+"."+name)
	}
	var have []string
	for k := range props {
		have = append(have, k)
	}
	slices.Sort(names)
	slices.Sort(have)
	if !slices.Equal(names, have) {
		t.Errorf("%s: the Go type has fields %v, the schema %v", where, names, have)
	}
	var sreq []string
	if r, ok := n["required"]; ok {
		sreq = strs(r)
	}
	slices.Sort(req)
	slices.Sort(sreq)
	if !slices.Equal(req, sreq) {
		t.Errorf("%s: the Go type requires %v, the schema %v", where, req, sreq)
	}
}

func checkValue(t *testing.T, root, n node, typ reflect.Type, where string) {
	t.Helper()
	n = n.resolve(t, root)
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	enums := map[reflect.Type][]string{
		reflect.TypeFor[Scope](): scopes, reflect.TypeFor[GapPolicy](): gapPolicies, reflect.TypeFor[FirstVersion](): firstVersions,
		reflect.TypeFor[TimeoutPolicy](): timeoutPolicies, reflect.TypeFor[DedupeStore](): dedupeStores,
	}
	want := map[reflect.Kind]string{reflect.String: "string", reflect.Int: "integer", reflect.Bool: "boolean", reflect.Slice: "array", reflect.Struct: "object"}[typ.Kind()]
	if typ == reflect.TypeFor[Duration]() {
		want = "string"
		if _, ok := n["pattern"]; !ok {
			t.Errorf("%s: a duration without a pattern", where)
		}
	}
	if n["type"] != want {
		t.Errorf("%s: the schema's type is %v, the Go type %s (%s)", where, n["type"], typ, want)
	}
	if e, ok := enums[typ]; ok && (n["enum"] == nil || !slices.Equal(strs(n["enum"]), e)) {
		t.Errorf("%s: the schema's enum is %v, the Go values %v", where, n["enum"], e)
	}
	switch typ.Kind() {
	case reflect.Struct:
		checkStruct(t, root, n, typ, where)
	case reflect.Slice:
		items, _ := n["items"].(map[string]any)
		checkValue(t, root, node(items), typ.Elem(), where+"[]")
	}
}

// The schema's duration pattern accepts what Duration reads, and refuses
// what it refuses.
func TestSchemaDurationPattern(t *testing.T) {
	var root node
	if err := json.Unmarshal(Schema(), &root); err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(root["$defs"].(map[string]any)["Duration"].(map[string]any)["pattern"].(string))
	for _, s := range []string{"0", "5s", "500ms", "1m30s", "720h", "1.5h", "300us", "2µs", "10ns", ".5s", "5", "1d", "s", "5 s", "-5s", "1h 30m", "", "5S"} {
		_, err := time.ParseDuration(s)
		parses := err == nil && !strings.HasPrefix(s, "-") // a negative duration is refused by the checks, not the syntax
		if re.MatchString(s) != parses {
			t.Errorf("%q: pattern matches %v, Go reads it %v", s, re.MatchString(s), parses)
		}
	}
}
