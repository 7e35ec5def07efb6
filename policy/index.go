package policy

import (
	"strings"

	"go.yaml.in/yaml/v3"
)

// index locates a file's fields by line, for its problems.
type index struct {
	// consumers is the line of each entry under consumers.
	consumers []int
	// groups is the group each entry names ("" for none).
	groups []string
	// fields are the file's keys, in the file's order.
	fields []field
}

// field is one key of the file.
type field struct {
	consumer int    // its entry, -1 for a key outside consumers
	path     string // such as "failures.ladder"
	line     int
	column   int
}

// newIndex indexes the document root.
func newIndex(root *yaml.Node) *index {
	idx := &index{}
	top := root
	if top.Kind == yaml.DocumentNode && len(top.Content) == 1 {
		top = top.Content[0]
	}
	if top.Kind != yaml.MappingNode {
		return idx
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		idx.fields = append(idx.fields, field{-1, k.Value, k.Line, k.Column})
		if k.Value != "consumers" || v.Kind != yaml.SequenceNode {
			idx.walk(v, -1, k.Value)
			continue
		}
		for _, item := range v.Content {
			idx.consumers = append(idx.consumers, item.Line)
			idx.groups = append(idx.groups, scalar(item, "group"))
			idx.walk(item, len(idx.consumers)-1, "")
		}
	}
	return idx
}

// walk indexes the keys of mapping n and of the mappings inside it.
func (idx *index) walk(n *yaml.Node, consumer int, prefix string) {
	if n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		path := join(prefix, k.Value)
		idx.fields = append(idx.fields, field{consumer, path, k.Line, k.Column})
		idx.walk(n.Content[i+1], consumer, path)
	}
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// line returns the line of path in entry consumer (-1: outside the
// entries), or of its nearest enclosing field, or of the entry; 0 when
// the file is not indexed.
func (idx *index) line(consumer int, path string) int {
	if idx == nil {
		return 0
	}
	for p := path; p != ""; {
		for _, f := range idx.fields {
			if f.consumer == consumer && f.path == p {
				return f.line
			}
		}
		i := strings.LastIndexByte(p, '.')
		if i < 0 {
			break
		}
		p = p[:i]
	}
	if consumer >= 0 && consumer < len(idx.consumers) {
		return idx.consumers[consumer]
	}
	return 0
}

// at returns the entry and the field a position belongs to: the last key
// before it (consumer -1 and path "" when none); column 0 stands for the
// end of the line.
func (idx *index) at(line, column int) (consumer int, path string) {
	consumer = -1
	for i, l := range idx.consumers {
		if l <= line {
			consumer = i
		}
	}
	for _, f := range idx.fields {
		if f.line > line || f.line == line && column > 0 && f.column >= column {
			break
		}
		if f.consumer == consumer {
			path = f.path
		}
	}
	return consumer, path
}

// group returns the group entry consumer names, read from the file
// ("" when it names none).
func (idx *index) group(consumer int) string {
	if consumer < 0 || consumer >= len(idx.groups) {
		return ""
	}
	return idx.groups[consumer]
}

// scalar returns the value of key in mapping n ("" when n has none).
func scalar(n *yaml.Node, key string) string {
	if n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}
