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

	"github.com/twmb/franz-go/pkg/kgo"
)

// Exit codes.
const (
	exitOK      = 0 // the command did what it was asked
	exitFailure = 1 // the command ran and failed (or refused)
	exitUsage   = 2 // the command line is wrong: nothing was done
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
	// flags declares the command's flags on fs and returns the function
	// that runs the command once they are parsed.
	flags func(fs *flag.FlagSet, e *env) func(ctx context.Context) error
}

// env is what a command runs with: its output streams and the process
// environment.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

func commands() []*command {
	return []*command{dltListCmd(), dltShowCmd(), dltRedriveCmd(), replayCmd(), outboxStatusCmd(), devCmd()}
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
	e := &env{stdout: stdout, stderr: stderr, getenv: os.Getenv}
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
			if args[1] == "dlt" && len(args) == 2 {
				fmt.Fprint(stdout, dltUsage())
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
		if args[0] == "dlt" {
			if len(args) == 1 {
				fmt.Fprint(stderr, dltUsage())
				return exitUsage
			}
			if h := args[1]; h == "help" || h == "-h" || h == "-help" || h == "--help" {
				fmt.Fprint(stdout, dltUsage())
				return exitOK
			}
			fmt.Fprintf(stderr, "kscope dlt: unknown subcommand %q\n\n%s", args[1], dltUsage())
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
	fn := c.flags(fs, e)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(e.stdout, commandUsage(c, e))
			return exitOK
		}
		fmt.Fprintf(e.stderr, "kscope %s: %v\nRun 'kscope %s -h' for usage.\n", c.name, err, c.name)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "kscope %s: unexpected argument %q (flags only; a flag after an argument is not read)\nRun 'kscope %s -h' for usage.\n", c.name, fs.Arg(0), c.name)
		return exitUsage
	}
	err := fn(ctx)
	if err == nil {
		return exitOK
	}
	if u, ok := errors.AsType[*usageError](err); ok {
		fmt.Fprintf(e.stderr, "kscope %s: %s\nRun 'kscope %s -h' for usage.\n", c.name, u.msg, c.name)
		return exitUsage
	}
	fmt.Fprintf(e.stderr, "kscope %s: %v\n", c.name, err)
	return exitFailure
}

// usageError is a wrong command line: the command did nothing.
type usageError struct{ msg string }

func (u *usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

func mainUsage() string {
	var b strings.Builder
	b.WriteString(`kscope inspects and repairs what kscope consumers leave in Kafka: dead-letter
topics and consumer group offsets.

Usage:
  kscope <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-13s %s\n", c.name, c.summary)
	}
	b.WriteString(`  help          this text; "kscope help <command>" for a command's flags

Every command takes --brokers (default: $KAFKA_BROKERS, comma separated).
kscope --version prints the version.
Exit codes: 0 ok, 1 failure or refusal, 2 wrong command line.

Examples:
  export KAFKA_BROKERS=localhost:9092
  kscope dlt list --group payments
  kscope dlt show --group payments --partition 0 --offset 42
  kscope dlt redrive --group payments --to source --class retryable --dry-run
  kscope replay --group payments --topic orders --to-time 2024-05-01T00:00:00Z
`)
	return b.String()
}

func dltUsage() string {
	var b strings.Builder
	b.WriteString("kscope dlt: read and redrive a consumer group's dead-letter topic.\n\nUsage:\n")
	for _, c := range commands() {
		if strings.HasPrefix(c.name, "dlt ") {
			fmt.Fprintf(&b, "  kscope %-12s %s\n", c.name, c.summary)
		}
	}
	b.WriteString("\nRun 'kscope dlt <subcommand> -h' for its flags and examples.\n")
	return b.String()
}

func commandUsage(c *command, e *env) string {
	var b strings.Builder
	b.WriteString(strings.TrimLeft(c.usage, "\n"))
	b.WriteString("\nFlags:\n")
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	c.flags(fs, e)
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

// newClient returns a client on brokers for admin requests and producing.
// Nothing is produced to a topic that does not exist: the client never
// creates topics.
func newClient(brokers []string, opts ...kgo.Opt) (*kgo.Client, error) {
	base := []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ClientID("kscope-cli"),
		kgo.RetryTimeout(defaultRetryTimeout),
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("bad --brokers %q: %w", strings.Join(brokers, ","), err)
	}
	return cl, nil
}

// reachErr explains an error from the first request to the cluster.
func reachErr(brokers []string, err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("cannot talk to the brokers %s: %w (check --brokers or KAFKA_BROKERS, and that the cluster is up)", strings.Join(brokers, ","), err)
}

func sortedPartitions[V any](m map[int32]V) []int32 {
	ps := make([]int32, 0, len(m))
	for p := range m {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	return ps
}
