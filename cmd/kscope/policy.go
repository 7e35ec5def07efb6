package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/kscope-dev/kscope/policy"
	"github.com/kscope-dev/kscope/retrytopic"
)

// policyEnv is the environment variable that names the policy file when
// --policy does not.
const policyEnv = "KSCOPE_POLICY"

// refusal is a command that did nothing because what it was given (the
// policy file, or what the policy allows) says not to: exit status 2,
// without the usage hint of a wrong command line.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

func refusef(format string, args ...any) error {
	return &refusal{fmt.Sprintf(format, args...)}
}

// globalFlags declares the flags every command takes.
func globalFlags(fs *flag.FlagSet, e *env) {
	fs.StringVar(&e.policyFlag, "policy", e.policyFlag, "the service's policy `file` (default $"+policyEnv+"): replay refuses a group whose entry says replay: false; dlt list and dlt show print its owner of a dead letter without a kscope-owner header")
}

// takeGlobalFlags reads the global flags given before the command (only
// --policy), and returns the arguments after them.
func takeGlobalFlags(e *env, args []string) ([]string, error) {
	for len(args) > 0 {
		name, value, hasValue := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		if name != "policy" || !strings.HasPrefix(args[0], "-") {
			return args, nil
		}
		args = args[1:]
		if !hasValue {
			if len(args) == 0 {
				return nil, usagef("--policy needs a file: kscope --policy FILE <command>")
			}
			value, args = args[0], args[1:]
		}
		e.policyFlag = value
	}
	return args, nil
}

// policyPath returns the policy file from --policy or KSCOPE_POLICY ("" for
// none).
func (e *env) policyPath() string {
	if e.policyFlag != "" {
		return e.policyFlag
	}
	return strings.TrimSpace(e.getenv(policyEnv))
}

// loadPolicy loads the policy file at path. A file that cannot be read or
// is not valid is a refusal that lists its problems.
func loadPolicy(path string) (*policy.File, error) {
	f, err := policy.Load(path)
	var pe *policy.Error
	switch {
	case errors.As(err, &pe):
		lines := make([]string, len(pe.Problems))
		for i, p := range pe.Problems {
			lines[i] = "  " + p.Error()
		}
		return nil, refusef("the policy file %s is not valid (%s); nothing was done:\n%s", path, plural(len(lines), "problem"), strings.Join(lines, "\n"))
	case err != nil:
		return nil, refusef("%s; check --policy or %s", strings.TrimPrefix(err.Error(), "policy: "), policyEnv)
	}
	return f, nil
}

// policyCheckUsage is policy check's synopsis, description and examples.
const policyCheckUsage = `
Usage:
  kscope policy check [FILE]

Validates a service's policy file (FILE, or the file --policy or
$KSCOPE_POLICY names) as the library's policy.Load does: strictly (a field
the format does not have is an error), then with the library's own checks.
It prints each consumer group's entry when the file is valid (exit 0), and
every problem, each naming the file, the line, the consumer group, the
field and what to change, when it is not (exit 2). It talks to no server.

Examples:
  kscope policy check kscope-policy.yaml
  KSCOPE_POLICY=kscope-policy.yaml kscope policy check
`

func policyCheckCmd() *command {
	return &command{
		name:      "policy check",
		summary:   "validate a service's policy file: every problem with its line and fix",
		usage:     policyCheckUsage,
		takesArgs: true,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			return func(context.Context) error { return policyCheck(e) }
		},
	}
}

// policyArg loads the policy file a policy command (kscope policy cmd) is
// given: its argument, else --policy or KSCOPE_POLICY.
func policyArg(e *env, cmd string) (string, *policy.File, error) {
	path := e.policyPath()
	switch {
	case len(e.args) > 1:
		return "", nil, usagef("give one policy file, got %d", len(e.args))
	case len(e.args) == 1:
		path = e.args[0]
	case path == "":
		return "", nil, usagef("give the policy file: kscope policy %s FILE (or --policy FILE, or %s)", cmd, policyEnv)
	}
	f, err := loadPolicy(path)
	return path, f, err
}

// policyCheck runs policy check.
func policyCheck(e *env) error {
	path, f, err := policyArg(e, "check")
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s: valid, %s\n", path, plural(len(f.Consumers), "consumer group"))
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tSCOPE\tOWNER\tREPLAY\tDEDUPE\tLAG P95\tDEAD-LETTER TOPIC")
	for _, c := range f.Consumers {
		dlt, keep := retrytopic.DLTopic(c.Group), "unlimited"
		if d := c.DeadLetter; d != nil {
			if d.Topic != "" {
				dlt = d.Topic
			}
			if d.Retention > 0 {
				keep = d.Retention.String()
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s (%s)\t%s\t%s\t%s\t%s (retention %s)\n", c.Group, c.Scope, c.Owner.Team, c.Owner.Contact,
			map[bool]string{true: "allowed", false: "refused"}[c.Replay], dedupeColumn(c), c.LagP95(), dlt, keep)
	}
	return tw.Flush()
}

// dedupeColumn says what dedupes a consumer's records: its store in the
// at_least_once scope (none when undeclared), the scope's own otherwise.
func dedupeColumn(c policy.Consumer) string {
	switch {
	case c.Scope == policy.ScopeDB:
		return "inbox"
	case c.Scope == policy.ScopeKafka:
		return "changelog"
	case c.Dedupe == "":
		return string(policy.DedupeNone)
	}
	return string(c.Dedupe)
}

// policyRulesCmd prints the Prometheus rules that declare the policy's
// consumers to kscope's alerts.
func policyRulesCmd() *command {
	return &command{
		name:      "policy rules",
		summary:   "print the Prometheus rules that declare a policy's consumers to kscope's alerts",
		takesArgs: true,
		usage: `
Usage:
  kscope policy rules [FILE] > pipelines.yml

Prints, for each consumer group of the policy file (FILE, or the file
--policy or $KSCOPE_POLICY names), the series kscope's alert rules read
(examples/observability/alerts.yml): kscope_pipeline_info (consumer_group,
critical, team, scope), which says which groups must run and which page on
one dead letter, and kscope_pipeline_lag_objective_seconds, the lag
objective at p95 the lag and handling-time alerts compare against. Load the
output beside alerts.yml in place of a hand-kept pipelines.yml. It talks
to no server.

Examples:
  kscope policy rules kscope-policy.yaml > /etc/prometheus/rules/pipelines.yml
`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			return func(context.Context) error {
				_, f, err := policyArg(e, "rules")
				if err != nil {
					return err
				}
				_, err = e.stdout.Write(f.Rules())
				return err
			}
		},
	}
}

// policySchemaCmd prints the policy file's JSON Schema.
func policySchemaCmd() *command {
	return &command{
		name:    "policy schema",
		summary: "print the policy file's JSON Schema, for editors",
		usage: `
Usage:
  kscope policy schema > kscope-policy.schema.json

Prints the JSON Schema (draft 2020-12) of the policy file. With the YAML
language server, a policy file whose first line is
  # yaml-language-server: $schema=kscope-policy.schema.json
gets completion and checks as it is typed; kscope policy check checks more
(the library's own checks, such as a retry ladder that must increase).
`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			return func(context.Context) error {
				_, err := e.stdout.Write(policy.Schema())
				return err
			}
		},
	}
}

// replayPolicy checks a replay of group against the policy file, when one
// is given: it refuses a group whose entry says replay: false, and returns
// what the entry says of the group (no note without a policy file, no
// entry for a group the file does not list).
func (e *env) replayPolicy(group string) (replayPolicy, error) {
	path := e.policyPath()
	if path == "" {
		return replayPolicy{}, nil
	}
	f, err := loadPolicy(path)
	if err != nil {
		return replayPolicy{}, err
	}
	c, ok := f.Consumer(group)
	if !ok {
		return replayPolicy{path: path, note: fmt.Sprintf("policy %s: no entry for consumer group %s, so no policy governs this replay", path, group)}, nil
	}
	if !c.Replay {
		return replayPolicy{}, refusef("refused: the policy %s says replay: false for consumer group %s (%s scope, owned by %s, %s): its effects must not run again, so its offsets are not moved; nothing was changed. If this replay is safe, ask the owner to set replay: true in the policy first.",
			path, group, c.Scope, c.Owner.Team, c.Owner.Contact)
	}
	note := fmt.Sprintf("policy %s: consumer group %s (%s scope, owned by %s, %s) allows a replay", path, group, c.Scope, c.Owner.Team, c.Owner.Contact)
	return replayPolicy{path: path, note: note, entry: &c}, nil
}
