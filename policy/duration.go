package policy

import (
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a duration written as Go writes one: a number and a unit,
// such as 500ms, 30s, 1m30s or 720h. A bare number is refused: its unit
// would be a guess.
type Duration time.Duration

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// String returns d as Go writes durations.
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML reads a duration from a YAML string such as "30s".
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	bad := func(format string, args ...any) error {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: column %d: ", n.Line, n.Column) + fmt.Sprintf(format, args...)}}
	}
	if n.Kind != yaml.ScalarNode {
		return bad("want a duration such as 30s here, not a list or a mapping")
	}
	v, err := time.ParseDuration(n.Value)
	switch {
	case err == nil:
		*d = Duration(v)
		return nil
	case n.Tag == "!!int" || n.Tag == "!!float":
		return bad("%s is a number without a unit; write a duration such as %ss, %sms or %sm", n.Value, n.Value, n.Value, n.Value)
	}
	return bad("%q is not a duration; write one as Go does, such as 500ms, 30s, 1m30s or 720h", n.Value)
}

// MarshalYAML writes d as a string such as "30s".
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }
