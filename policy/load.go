package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Load reads and validates the policy file at path. An error that is not
// about reading the file is an *Error listing every problem, each naming
// the file, the line, the consumer, the field and what to change.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: reading %w", err)
	}
	return Parse(path, data)
}

// Parse reads and validates a policy file's contents; name is what its
// problems call the file (its path). Decoding is strict: a field the format
// does not have, a value of the wrong type and a missing required field are
// problems. The file is validated only once it decodes: a file with
// problems of both kinds shows the first kind first. A returned error is
// an *Error.
func Parse(name string, data []byte) (*File, error) {
	ps := &problems{file: name}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			ps.add(-1, "", "", "the file is empty; start it with version: %d and list the consumer groups under consumers:", FormatVersion)
		} else {
			ps.syntax(err)
		}
		return nil, ps.err()
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		ps.add(-1, "", "", "holds more than one YAML document (a --- line); keep one, with every consumer group under its consumers:")
		return nil, ps.err()
	}
	ps.index = newIndex(&root)
	if root.Content[0].Kind != yaml.MappingNode {
		ps.add(-1, "", "", "is not a mapping; start it with version: %d and list the consumer groups under consumers:", FormatVersion)
		return nil, ps.err()
	}
	f := &File{path: name, index: ps.index}
	strict := yaml.NewDecoder(bytes.NewReader(data))
	strict.KnownFields(true)
	if err := strict.Decode(f); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			ps.syntax(err)
			return nil, ps.err()
		}
		for _, msg := range te.Errors {
			ps.decodeError(msg)
		}
	}
	required(ps, root.Content[0], reflect.TypeFor[File](), -1, "")
	if len(ps.list) > 0 {
		return nil, ps.err()
	}
	for i := range f.Consumers {
		f.Consumers[i].file = name
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return f, nil
}

var lineRE = regexp.MustCompile(`^(?:yaml: )?line (\d+): (?:column (\d+): )?(.*)$`)

// syntax records a YAML syntax error.
func (ps *problems) syntax(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	p := Problem{File: ps.file, Reason: msg + "; fix the YAML"}
	if m := lineRE.FindStringSubmatch(msg); m != nil {
		p.Line, _ = strconv.Atoi(m[1])
		p.Reason = m[3] + "; fix the YAML"
	}
	ps.list = append(ps.list, p)
}

var (
	unknownRE  = regexp.MustCompile(`^field (\S+) not found in type policy\.(\w+)$`)
	mismatchRE = regexp.MustCompile("^cannot unmarshal !!(\\w+)(?: `(.*)`)? into (\\S+)$")
)

// decodeError records one of the strict decoder's errors, located by its
// line.
func (ps *problems) decodeError(msg string) {
	m := lineRE.FindStringSubmatch(msg)
	if m == nil {
		ps.list = append(ps.list, Problem{File: ps.file, Reason: msg})
		return
	}
	line, _ := strconv.Atoi(m[1])
	column, _ := strconv.Atoi(m[2])
	consumer, path := ps.index.at(line, column)
	reason := m[3]
	if u := unknownRE.FindStringSubmatch(reason); u != nil {
		reason = fmt.Sprintf("%q is not a field here; check its spelling: the fields are %s", u[1], strings.Join(fieldNames(u[2]), ", "))
	} else if u := mismatchRE.FindStringSubmatch(reason); u != nil && u[1] != "map" && u[1] != "seq" {
		reason = fmt.Sprintf("%q is not %s; write %s", u[2], kindName(u[3]), kindExample(u[3]))
	} else if u != nil {
		reason = fmt.Sprintf("a %s is not %s here; write %s", map[string]string{"map": "mapping", "seq": "list"}[u[1]], kindName(u[3]), kindExample(u[3]))
	}
	ps.list = append(ps.list, Problem{File: ps.file, Line: line, Consumer: ps.groupAt(consumer), Field: path, Reason: reason})
}

// groupAt names entry consumer by its group, read from the index's node
// values ("" outside the entries).
func (ps *problems) groupAt(consumer int) string {
	if consumer < 0 {
		return ""
	}
	if g := ps.index.group(consumer); g != "" {
		return g
	}
	return fmt.Sprintf("consumers[%d]", consumer)
}

// kindName names a Go type of the file for a mismatch.
func kindName(goType string) string {
	switch strings.TrimPrefix(goType, "[]") {
	case "int":
		return "an integer"
	case "bool":
		return "true or false"
	case "string", "policy.Scope", "policy.GapPolicy", "policy.FirstVersion", "policy.TimeoutPolicy":
		return "a single value"
	}
	if strings.HasPrefix(goType, "[]") {
		return "a list"
	}
	return "a mapping of fields"
}

// kindExample shows how to write a value of a Go type of the file.
func kindExample(goType string) string {
	switch goType {
	case "int":
		return "a whole number, such as 3"
	case "bool":
		return "true or false"
	case "[]policy.Duration":
		return "a list of durations, such as [5s, 1m, 10m]"
	case "[]policy.Consumer":
		return "a list of entries, each starting with - group: <consumer group>"
	}
	if strings.HasPrefix(goType, "policy.") {
		if t, ok := fileTypes()[strings.TrimPrefix(goType, "policy.")]; ok && t.Kind() == reflect.Struct {
			return "its fields indented under it: " + strings.Join(fieldNames(t.Name()), ", ")
		}
	}
	return "a single value"
}

// required records each required field (tagged policy:"required") that
// mapping n of type t lacks, and looks inside the fields it has; consumer
// is the entry n is in (-1 outside the entries), prefix its path.
func required(ps *problems, n *yaml.Node, t reflect.Type, consumer int, prefix string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, item := range n.Content {
			c, pre := consumer, prefix
			if t.Elem() == reflect.TypeFor[Consumer]() {
				c, pre = i, ""
			}
			required(ps, item, t.Elem(), c, pre)
		}
		return
	case t.Kind() != reflect.Struct || n.Kind != yaml.MappingNode:
		return
	}
	have := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		have[n.Content[i].Value] = n.Content[i+1]
	}
	for _, sf := range reflect.VisibleFields(t) {
		name := yamlName(sf)
		if name == "" {
			continue
		}
		v, ok := have[name]
		path := join(prefix, name)
		switch {
		case ok:
			required(ps, v, sf.Type, consumer, path)
		case sf.Tag.Get("policy") == "required":
			p := Problem{File: ps.file, Line: n.Line, Consumer: ps.groupAt(consumer), Field: path,
				Reason: "missing; " + missingFix(path)}
			ps.list = append(ps.list, p)
		}
	}
}

// missingFix says how to add a required field.
func missingFix(path string) string {
	switch path {
	case "version":
		return fmt.Sprintf("add version: %d at the top of the file", FormatVersion)
	case "consumers":
		return "list the consumer groups under consumers:, one entry each, starting with - group: <consumer group>"
	case "group":
		return "add group: <the consumer group id>, as consumer.Config.Group names it"
	case "scope":
		return "add scope: " + strings.Join(scopes, ", ")
	case "owner":
		return "add owner: {team: <owning team>, contact: <channel, address or rotation>}"
	case "owner.team":
		return "add team: <the team that owns the consumer>"
	case "owner.contact":
		return "add contact: <how to reach the owning team: a channel, an address or a rotation>"
	case "replay":
		return "add replay: true when kscope replay may move this group's offsets, or replay: false when its effects must never run again"
	case "lag_objective.p95_seconds":
		return "add p95_seconds: <seconds>, or remove lag_objective for the default, 120 seconds"
	case "gaps.policy":
		return "add policy: " + strings.Join(gapPolicies, ", ")
	}
	return "add it"
}

// yamlName returns a struct field's YAML key ("" for none).
func yamlName(sf reflect.StructField) string {
	name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
	if !sf.IsExported() || name == "-" {
		return ""
	}
	return name
}

// fieldNames lists the YAML keys of the file's struct type named name.
func fieldNames(name string) []string {
	t, ok := fileTypes()[name]
	if !ok {
		return nil
	}
	var out []string
	for _, sf := range reflect.VisibleFields(t) {
		if n := yamlName(sf); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// fileTypes returns the file's struct types by name.
func fileTypes() map[string]reflect.Type {
	out := map[string]reflect.Type{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || out[t.Name()] != nil {
			return
		}
		out[t.Name()] = t
		for _, sf := range reflect.VisibleFields(t) {
			if yamlName(sf) != "" {
				walk(sf.Type)
			}
		}
	}
	walk(reflect.TypeFor[File]())
	return out
}
