package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/kscope-dev/kscope/internal/testenv"
)

// Exit codes.
const (
	exitOK      = 0 // the command did what it was asked
	exitFailure = 1 // the command ran and failed (or refused)
	exitUsage   = 2 // the command line is wrong: nothing was done
	exitRefused = 2 // the policy file is not valid, or forbids what was asked: nothing was done
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one subcommand: "dlt list", "replay", ...
type command struct {
	name    string
	summary string
	// usage is the synopsis, a description and examples; the flag list
	// is appended to it.
	usage string
	// takesArgs says that the command takes arguments among its flags
	// (row identities), which it reads from env.args; the others refuse
	// any.
	takesArgs bool
	// flags declares the command's flags on fs and returns the function
	// that runs the command once they are parsed.
	flags func(fs *flag.FlagSet, e *env) func(ctx context.Context) error
}

// env is what a command runs with: its output streams, the process
// environment, and the arguments given among its flags.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	args           []string
	// findPostgres returns the directory of the PostgreSQL server
	// binaries, for kscope dev (testenv.FindPostgresBin).
	findPostgres func() (string, error)
	// policyFlag is --policy, given before the command or among its flags.
	policyFlag string
}

func commands() []*command {
	return []*command{dltListCmd(), dltShowCmd(), dltRedriveCmd(), dltSkipCmd(), dltDeleteCmd(), replayCmd(), outboxStatusCmd(),
		outboxDeadListCmd(), outboxDeadShowCmd(), outboxDeadRequeueCmd(), outboxDeadDiscardCmd(), devCmd(),
		policyCheckCmd(), policyRulesCmd(), policySchemaCmd(), auditCmd(), shareDescribeCmd(), shareResetCmd()}
}

// groups are the first words of several commands, longest first, and
// what those commands are for: "kscope dlt" alone lists its commands.
var groups = []struct{ name, summary string }{
	{"outbox dead", "list, show, requeue and discard the rows an outbox relay moved to its dead-letter table"},
	{"outbox", "see how far an outbox's relay is, and the rows Kafka refused"},
	{"dlt", "read, redrive, skip and delete the records of a consumer group's dead-letter topic"},
	{"share", "see a share group's members and backlog, and move its start offsets"},
	{"policy", "check a service's policy file, print the alert rules' series it declares, and its JSON Schema"},
}

// findGroup returns the longest group that words start with, and its
// number of words (0 when none).
func findGroup(words []string) (name, summary string, n int) {
	for _, g := range groups {
		parts := strings.Fields(g.name)
		if len(words) >= len(parts) && strings.Join(words[:len(parts)], " ") == g.name {
			return g.name, g.summary, len(parts)
		}
	}
	return "", "", 0
}

// isHelp reports whether w asks for help.
func isHelp(w string) bool {
	return w == "help" || w == "-h" || w == "-help" || w == "--help"
}

func findCommand(words []string) (*command, int) {
	for _, c := range commands() {
		parts := strings.Fields(c.name)
		if len(words) >= len(parts) && strings.Join(words[:len(parts)], " ") == c.name {
			return c, len(parts)
		}
	}
	return nil, 0
}

// run is the whole program: it parses args (without the program name),
// runs the command and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runEnv(ctx, &env{stdout: stdout, stderr: stderr, getenv: os.Getenv, findPostgres: testenv.FindPostgresBin}, args)
}

// runEnv is run in e.
func runEnv(ctx context.Context, e *env, args []string) int {
	stdout, stderr := e.stdout, e.stderr
	args, err := takeGlobalFlags(e, args)
	if err != nil {
		fmt.Fprintf(stderr, "kscope: %v\n\n%s", err, mainUsage())
		return exitUsage
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage())
		return exitUsage
	}
	switch args[0] {
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, versionLine())
		return exitOK
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			if c, n := findCommand(args[1:]); c != nil && n == len(args)-1 {
				fmt.Fprint(stdout, commandUsage(c, e))
				return exitOK
			}
			if g, summary, n := findGroup(args[1:]); n > 0 && n == len(args)-1 {
				fmt.Fprint(stdout, groupUsage(g, summary))
				return exitOK
			}
			fmt.Fprintf(stderr, "kscope: no help for %q: it is not a command.\n\n%s", strings.Join(args[1:], " "), mainUsage())
			return exitUsage
		}
		fmt.Fprint(stdout, mainUsage())
		return exitOK
	}
	c, n := findCommand(args)
	if c == nil {
		if g, summary, n := findGroup(args); n > 0 {
			if len(args) == n {
				fmt.Fprint(stderr, groupUsage(g, summary))
				return exitUsage
			}
			if isHelp(args[n]) {
				fmt.Fprint(stdout, groupUsage(g, summary))
				return exitOK
			}
			fmt.Fprintf(stderr, "kscope %s: unknown subcommand %q\n\n%s", g, args[n], groupUsage(g, summary))
			return exitUsage
		}
		fmt.Fprintf(stderr, "kscope: unknown command %q\n\n%s", args[0], mainUsage())
		return exitUsage
	}
	return runCommand(ctx, c, e, args[n:])
}

func runCommand(ctx context.Context, c *command, e *env, args []string) int {
	fs := flag.NewFlagSet("kscope "+c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	globalFlags(fs, e)
	fn := c.flags(fs, e)
	// The flag package stops at the first argument: a command that takes
	// arguments reads its flags before, between and after them, and every
	// word after "--" as an argument.
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(e.stdout, commandUsage(c, e))
				return exitOK
			}
			fmt.Fprintf(e.stderr, "kscope %s: %v\nRun 'kscope %s -h' for usage.\n", c.name, err, c.name)
			return exitUsage
		}
		left := fs.Args()
		if len(left) == 0 {
			break
		}
		if !c.takesArgs {
			fmt.Fprintf(e.stderr, "kscope %s: unexpected argument %q (flags only; a flag after an argument is not read)\nRun 'kscope %s -h' for usage.\n", c.name, fs.Arg(0), c.name)
			return exitUsage
		}
		if used := len(rest) - len(left); used > 0 && rest[used-1] == "--" {
			e.args = append(e.args, left...)
			break
		}
		e.args = append(e.args, left[0])
		rest = left[1:]
	}
	err := fn(ctx)
	if err == nil {
		return exitOK
	}
	if u, ok := errors.AsType[*usageError](err); ok {
		fmt.Fprintf(e.stderr, "kscope %s: %s\nRun 'kscope %s -h' for usage.\n", c.name, u.msg, c.name)
		return exitUsage
	}
	if r, ok := errors.AsType[*refusal](err); ok {
		fmt.Fprintf(e.stderr, "kscope %s: %s\n", c.name, r.msg)
		return exitRefused
	}
	fmt.Fprintf(e.stderr, "kscope %s: %s\n", c.name, message(c.name, err))
	return exitFailure
}

// message is err's message after "kscope <command>: ", without the
// "kscope: " that the library's errors start with, nor the command's name
// again: the line says "kscope" once.
func message(command string, err error) string {
	msg := strings.ReplaceAll(err.Error(), ": kscope: ", ": ")
	msg = strings.TrimPrefix(msg, "kscope: ")
	return strings.TrimPrefix(msg, command+": ")
}

// usageError is a wrong command line: the command did nothing.
type usageError struct{ msg string }

func (u *usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

func mainUsage() string {
	var b strings.Builder
	b.WriteString(`kscope inspects and repairs what kscope consumers leave in Kafka (dead-letter
topics and consumer group offsets) and what an outbox relay leaves in
PostgreSQL (the rows Kafka refused).

Usage:
  kscope <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-20s %s\n", c.name, c.summary)
	}
	b.WriteString(`  help                 this text; "kscope help <command>" for a command's flags

The commands that talk to Kafka take --brokers (default: $KAFKA_BROKERS,
comma separated); the outbox commands take --database-url (default:
$DATABASE_URL). Both take --connect-timeout (default 10s) and
--request-timeout (default 15s): a server that does not take the
connection, or does not answer a request, within them fails the command,
and the error names it.
Every command takes --policy FILE (default: $KSCOPE_POLICY), the service's
policy file, before or after the command's name: replay refuses a group
whose entry says replay: false; dlt list and dlt show print its owner of
a dead letter without a kscope-owner header; kscope policy check FILE
validates one.
kscope --version prints the version.
Exit codes: 0 ok, 1 failure or refusal, 2 wrong command line, or a policy
that is not valid or forbids what was asked (nothing was done).

Examples:
  export KAFKA_BROKERS=localhost:9092
  kscope dlt list --group payments
  kscope dlt show --group payments --partition 0 --offset 42
  kscope dlt redrive --group payments --to source --class retryable --dry-run
  kscope replay --group payments --topic orders --to-time 2024-05-01T00:00:00Z
  kscope share describe --group thumbnails
  kscope outbox dead list --database-url "$DATABASE_URL"
  kscope outbox dead requeue default/3/1042 --yes
  kscope policy check kscope-policy.yaml
  kscope --policy kscope-policy.yaml replay --group payments --topic orders --to-start
`)
	return b.String()
}

// groupUsage lists the commands of group g, which are for summary.
func groupUsage(g, summary string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kscope %s: %s.\n\nUsage:\n", g, summary)
	for _, c := range commands() {
		if strings.HasPrefix(c.name, g+" ") {
			fmt.Fprintf(&b, "  kscope %-20s %s\n", c.name, c.summary)
		}
	}
	fmt.Fprintf(&b, "\nRun 'kscope %s <subcommand> -h' for its flags and examples.\n", g)
	return b.String()
}

func commandUsage(c *command, e *env) string {
	var b strings.Builder
	b.WriteString(strings.TrimLeft(c.usage, "\n"))
	b.WriteString("\nFlags:\n")
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.flags(fs, e)
	globalFlags(fs, e)
	printFlags(&b, fs)
	return b.String()
}

// printFlags lists fs's flags the way the usage texts spell them, with
// two dashes (the flag package accepts one or two).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		if def := f.DefValue; def != "" && def != "false" && def != "0" && def != "-1" {
			if name == "string" {
				def = strconv.Quote(def)
			}
			fmt.Fprintf(w, " (default %s)", def)
		}
		fmt.Fprintln(w)
	})
}

// versionLine is what kscope --version prints: the module version the
// binary was built from (or "devel"), its VCS revision when known, and
// the Go version.
func versionLine() string {
	v, rev := "devel", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, st := range bi.Settings {
			if st.Key == "vcs.revision" && len(st.Value) >= 12 {
				rev = " (" + st.Value[:12] + ")"
			}
		}
	}
	return fmt.Sprintf("kscope %s%s %s", v, rev, runtime.Version())
}

// brokerFlag declares --brokers.
func brokerFlag(fs *flag.FlagSet) *string {
	return fs.String("brokers", "", "seed brokers, comma separated (default $KAFKA_BROKERS)")
}

// brokers returns the seed brokers from the flag or KAFKA_BROKERS.
func (e *env) brokers(flagValue string) ([]string, error) {
	v := flagValue
	if strings.TrimSpace(v) == "" {
		v = e.getenv("KAFKA_BROKERS")
	}
	var out []string
	for _, b := range strings.Split(v, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, usagef("no brokers given: set --brokers or KAFKA_BROKERS (comma separated host:port)")
	}
	return out, nil
}

func sortedPartitions[V any](m map[int32]V) []int32 {
	ps := make([]int32, 0, len(m))
	for p := range m {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps
}
