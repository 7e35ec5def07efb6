package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// Table column widths: longer keys and errors are cut.
const (
	listKeyWidth   = 24
	listErrorWidth = 60
	// listFlushEvery bounds how many table rows are held to align columns.
	listFlushEvery = 1000
)

func dltListCmd() *command {
	return &command{
		name:    "dlt list",
		summary: "list the records of a dead-letter topic with their failure metadata",
		usage: `
Usage:
  kscope dlt list (--topic T | --group G) [filters] [--json]

Reads a dead-letter topic from its start up to the end offsets seen when the
command starts (it never waits for new records), with read-committed
isolation and no consumer group: nothing is committed. Records that a
transaction still open holds back are named in a warning; records deleted
(retention) after the read began and before it reached them fail it. For
each record it
prints the partition, offset, key, attempt count, error class, last failure
time, original topic/partition/offset and error message. Long keys and
messages are cut in the table; --json prints one complete JSON object per
line instead. Records are listed partition by partition, in offset order.

A record's identity (its kscope-id) can be dead-lettered twice when a
consumer died between the DLT's acknowledgement and the transaction that
remembers it. The table lists an identity once, at its first record, and
ends with the identities seen more than once and their counts; in --json
each line carries "copy", the record's number among its identity's (1 for
the first).

Examples:
  kscope dlt list --group payments
  kscope dlt list --topic payments.kscope-dlt --partition 2 --from-offset 100 --to-offset 200
  kscope dlt list --group payments --class terminal --json | jq .error
  kscope dlt list --group payments --key order-42
`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			f := declareDLTFlags(fs, true)
			asJSON := fs.Bool("json", false, "print one JSON object per record and line")
			return func(ctx context.Context) error { return dltList(ctx, e, f, *asJSON) }
		},
	}
}

// listEntry is one record in dlt list --json.
type listEntry struct {
	Copy      int     `json:"copy"`
	Topic     string  `json:"topic"`
	Partition int32   `json:"partition"`
	Offset    int64   `json:"offset"`
	Timestamp string  `json:"timestamp"`
	Key       *string `json:"key"`
	KeyHex    string  `json:"key_hex,omitempty"`
	metadataJSON
}

// metadataJSON is retrytopic.Metadata as JSON.
type metadataJSON struct {
	ID                string `json:"id"`
	Group             string `json:"group,omitempty"`
	Attempt           int    `json:"attempt"`
	Class             string `json:"class"`
	Error             string `json:"error"`
	FirstFailure      string `json:"first_failure,omitempty"`
	LastFailure       string `json:"last_failure,omitempty"`
	OriginalTopic     string `json:"original_topic"`
	OriginalPartition int32  `json:"original_partition"`
	OriginalOffset    int64  `json:"original_offset"`
	OriginalTimestamp string `json:"original_timestamp,omitempty"`
	Due               string `json:"due,omitempty"`
	Stage             *int   `json:"stage,omitempty"`
	Parked            bool   `json:"parked,omitempty"`
	DecodeWarning     string `json:"decode_warning,omitempty"`
}

func toMetadataJSON(m retrytopic.Metadata, derr error) metadataJSON {
	j := metadataJSON{
		ID:                m.ID,
		Group:             m.Group,
		Attempt:           m.Attempt,
		Class:             m.Class.String(),
		Error:             m.Error,
		FirstFailure:      timeText(m.FirstFailure),
		LastFailure:       timeText(m.LastFailure),
		OriginalTopic:     m.OriginalTopic,
		OriginalPartition: m.OriginalPartition,
		OriginalOffset:    m.OriginalOffset,
		OriginalTimestamp: timeText(m.OriginalTimestamp),
		Due:               timeText(m.Due),
		Parked:            m.Parked,
	}
	if m.Stage >= 0 {
		s := m.Stage
		j.Stage = &s
	}
	if derr != nil {
		j.DecodeWarning = derr.Error()
	}
	return j
}

// timeText renders t in RFC 3339 UTC with milliseconds, "" when zero.
func timeText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// keyJSON returns k as text when it is valid UTF-8, else as hex.
func keyJSON(k []byte) (*string, string) {
	if k == nil {
		return nil, ""
	}
	if utf8.Valid(k) {
		s := string(k)
		return &s, ""
	}
	return nil, hex.EncodeToString(k)
}

func dltList(ctx context.Context, e *env, f *dltFlags, asJSON bool) error {
	topic, err := f.dltTopic()
	if err != nil {
		return err
	}
	rng, flt, err := f.selection()
	if err != nil {
		return err
	}
	kc, err := e.kafka(*f.brokers, f.timeouts)
	if err != nil {
		return err
	}
	cl, err := kc.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	var (
		n, shown int
		tw       *tabwriter.Writer
		enc      = json.NewEncoder(e.stdout)
		copies   = map[string]int{} // identity -> records seen
		repeated []string           // identities seen more than once, in order
		bare     int                // records without kscope's failure headers
	)
	if !asJSON {
		tw = tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	}
	held, err := scan(ctx, kc, adm, topic, rng, func(r *kgo.Record) error {
		m, derr := decode(r)
		if !flt.match(r, m) {
			return nil
		}
		n++
		if !hasHeader(r, retrytopic.HeaderErrorClass) {
			bare++
		}
		warnDecode(e.stderr, r, derr)
		copies[m.ID]++
		if copies[m.ID] == 2 {
			repeated = append(repeated, m.ID)
		}
		if asJSON {
			k, kh := keyJSON(r.Key)
			return enc.Encode(listEntry{
				Copy:  copies[m.ID],
				Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
				Timestamp: timeText(r.Timestamp), Key: k, KeyHex: kh,
				metadataJSON: toMetadataJSON(m, derr),
			})
		}
		if copies[m.ID] > 1 {
			return nil // listed at its first record; counted below
		}
		shown++
		if shown == 1 {
			fmt.Fprintln(tw, "PARTITION\tOFFSET\tKEY\tATTEMPT\tCLASS\tLAST FAILURE\tORIGINAL\tERROR")
		}
		last := timeText(m.LastFailure)
		if last == "" {
			last = "-"
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%s\t%s\t%s/%d/%d\t%s\n",
			r.Partition, r.Offset, cell(keyText(r.Key), listKeyWidth), m.Attempt, m.Class, last,
			m.OriginalTopic, m.OriginalPartition, m.OriginalOffset, cell(m.Error, listErrorWidth))
		if n%listFlushEvery == 0 {
			return tw.Flush()
		}
		return nil
	})
	if tw != nil {
		if ferr := tw.Flush(); err == nil {
			err = ferr
		}
	}
	if err != nil {
		return err
	}
	for _, h := range held {
		fmt.Fprintf(e.stderr, "warning: %s\n", h)
	}
	if bare > 0 {
		fmt.Fprintf(e.stderr, "warning: %d of %s in %s carry no kscope failure headers (class, error, original topic): "+
			"it does not look like a kscope dead-letter topic (those are named <group>.kscope-dlt); their class is shown as unknown. Check --topic or --group.\n",
			bare, plural(n, "record"), topic)
	}
	if !asJSON {
		fmt.Fprintf(e.stdout, "%s in %s, %s\n", plural(n, "record"), topic, plural(len(copies), "identity"))
		for _, id := range repeated {
			fmt.Fprintf(e.stdout, "  %s: %d records (dead-lettered again after a crash between the DLT's acknowledgement and its inbox row)\n", id, copies[id])
		}
	}
	return nil
}

// keyText renders a key for the table: text when printable, "(null)", or
// "0x" and hex.
func keyText(k []byte) string {
	switch {
	case k == nil:
		return "(null)"
	case printable(k, false):
		return string(k)
	}
	return "0x" + hex.EncodeToString(k)
}

// cell makes s one table cell: control characters and tabs escaped, cut to
// width runes.
func cell(s string, width int) string {
	out := escape(s)
	if utf8.RuneCountInString(out) > width {
		rs := []rune(out)
		out = string(rs[:width-1]) + "…"
	}
	if out == "" {
		return "-"
	}
	return out
}

// escape writes control characters, tabs and newlines of s as Go escapes,
// so s prints on one line.
func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\t', r == '\n', r == '\r', !unicode.IsPrint(r):
			b.WriteString(strings.Trim(strconv.QuoteRune(r), "'"))
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// plural renders "1 record", "2 records".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "y") {
		return strconv.Itoa(n) + " " + noun[:len(noun)-1] + "ies"
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

// printable reports whether b is valid UTF-8 made of printable characters
// (and, when multiline is set, newlines and tabs).
func printable(b []byte, multiline bool) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsPrint(r) || multiline && (r == '\n' || r == '\t' || r == '\r') {
			continue
		}
		return false
	}
	return true
}

func dltShowCmd() *command {
	return &command{
		name:    "dlt show",
		summary: "print one dead-letter record in full: key, headers, value, metadata",
		usage: `
Usage:
  kscope dlt show (--topic T | --group G) --partition P --offset O [--max-value N] [--json]

Prints one record of a dead-letter topic: its key, every header (printable
text as is, anything else as hex), its value (as text when it is printable
UTF-8, else as a hex dump; cut to --max-value bytes) and the kscope failure
metadata decoded from its headers.

Examples:
  kscope dlt show --group payments --partition 0 --offset 42
  kscope dlt show --topic payments.kscope-dlt --partition 0 --offset 42 --max-value 0 --json
`,
		flags: func(fs *flag.FlagSet, e *env) func(context.Context) error {
			f := declareDLTFlags(fs, false)
			offset := fs.Int64("offset", -1, "the record's offset (required)")
			maxValue := fs.Int("max-value", 4096, "print at most this many bytes of the value (0: all)")
			asJSON := fs.Bool("json", false, "print the record as one JSON object")
			return func(ctx context.Context) error { return dltShow(ctx, e, f, *offset, *maxValue, *asJSON) }
		},
	}
}

// showEntry is dlt show --json.
type showEntry struct {
	Topic          string       `json:"topic"`
	Partition      int32        `json:"partition"`
	Offset         int64        `json:"offset"`
	Timestamp      string       `json:"timestamp"`
	Key            *string      `json:"key"`
	KeyHex         string       `json:"key_hex,omitempty"`
	Headers        []headerJSON `json:"headers"`
	Value          *string      `json:"value"`
	ValueHex       string       `json:"value_hex,omitempty"`
	ValueSize      int          `json:"value_size"`
	ValueTruncated bool         `json:"value_truncated,omitempty"`
	Metadata       metadataJSON `json:"metadata"`
}

type headerJSON struct {
	Key      string  `json:"key"`
	Value    *string `json:"value,omitempty"`
	ValueHex string  `json:"value_hex,omitempty"`
}

func dltShow(ctx context.Context, e *env, f *dltFlags, offset int64, maxValue int, asJSON bool) error {
	topic, err := f.dltTopic()
	if err != nil {
		return err
	}
	if *f.partition < 0 || offset < 0 {
		return usagef("give the record with --partition and --offset (see them with 'kscope dlt list')")
	}
	if maxValue < 0 {
		return usagef("--max-value must be 0 (no limit) or more, got %d", maxValue)
	}
	f.fromOffset, f.toOffset = &offset, &offset
	rng, _, err := f.selection()
	if err != nil {
		return err
	}
	kc, err := e.kafka(*f.brokers, f.timeouts)
	if err != nil {
		return err
	}
	cl, err := kc.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	bs, err := bounds(ctx, adm, kc, topic, rng)
	if err != nil {
		return err
	}
	if b := bs[rng.partition]; b.begin > offset {
		return fmt.Errorf("offset %d of %s partition %d no longer exists: the partition starts at %d (older records were deleted by retention)", offset, topic, rng.partition, b.begin)
	} else if b.begin >= b.end && b.heldTo > offset {
		return fmt.Errorf("offset %d of %s partition %d is held back by a transaction open since offset %d: a read-committed reader sees it once the transaction ends", offset, topic, rng.partition, b.end)
	} else if b.begin >= b.end {
		return fmt.Errorf("offset %d of %s partition %d is not written yet: the partition ends at %d", offset, topic, rng.partition, b.end)
	}
	var found *kgo.Record
	_, err = scan(ctx, kc, adm, topic, rng, func(r *kgo.Record) error {
		if r.Offset == offset {
			found = r
		}
		return nil
	})
	if err != nil {
		return err
	}
	if found == nil {
		return fmt.Errorf("no record at offset %d of %s partition %d: the offset holds a transaction marker, an aborted record or a compacted-away record", offset, topic, rng.partition)
	}
	m, derr := decode(found)
	if asJSON {
		return json.NewEncoder(e.stdout).Encode(showJSON(found, m, derr, maxValue))
	}
	showText(e.stdout, found, m, derr, maxValue)
	return nil
}

func cutValue(v []byte, maxValue int) ([]byte, bool) {
	if maxValue > 0 && len(v) > maxValue {
		return v[:maxValue], true
	}
	return v, false
}

func showJSON(r *kgo.Record, m retrytopic.Metadata, derr error, maxValue int) showEntry {
	k, kh := keyJSON(r.Key)
	s := showEntry{
		Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Timestamp: timeText(r.Timestamp), Key: k, KeyHex: kh,
		Headers:   []headerJSON{},
		ValueSize: len(r.Value),
		Metadata:  toMetadataJSON(m, derr),
	}
	s.Headers = headersJSON(r.Headers)
	s.Value, s.ValueHex, s.ValueTruncated = valueJSON(r.Value, maxValue)
	return s
}

// headersJSON returns headers as JSON shows them: as text where they are,
// else in hex.
func headersJSON(hs []kgo.RecordHeader) []headerJSON {
	out := []headerJSON{}
	for _, h := range hs {
		hj := headerJSON{Key: h.Key}
		if printable(h.Value, true) {
			v := string(h.Value)
			hj.Value = &v
		} else {
			hj.ValueHex = hex.EncodeToString(h.Value)
		}
		out = append(out, hj)
	}
	return out
}

// valueJSON returns a record's value, cut to maxValue bytes, as JSON shows
// it: as text where it is, else in hex; and whether it was cut.
func valueJSON(value []byte, maxValue int) (text *string, hexValue string, cut bool) {
	if value == nil {
		return nil, "", false
	}
	v, cut := cutValue(value, maxValue)
	if tv := textCut(v, cut); printable(tv, true) {
		t := string(tv)
		return &t, "", cut
	}
	return nil, hex.EncodeToString(v), cut
}

// textCut returns v, without the incomplete UTF-8 sequence a cut may have
// left at its end.
func textCut(v []byte, cut bool) []byte {
	if !cut {
		return v
	}
	for i := 0; i < utf8.UTFMax-1 && len(v) > 0 && !utf8.Valid(v); i++ {
		v = v[:len(v)-1]
	}
	return v
}

// headersText prints headers, one a line: as text where they are, else
// in hex.
func headersText(w io.Writer, hs []kgo.RecordHeader) {
	for _, h := range hs {
		if printable(h.Value, true) {
			fmt.Fprintf(w, "  %s: %s\n", h.Key, escape(string(h.Value)))
		} else {
			fmt.Fprintf(w, "  %s: 0x%s (binary)\n", h.Key, hex.EncodeToString(h.Value))
		}
	}
}

// valueText prints a record's value, cut to maxValue bytes: as text where
// it is, else as a hex dump.
func valueText(w io.Writer, value []byte, maxValue int) {
	if value == nil {
		fmt.Fprintf(w, "value:      (null)\n")
		return
	}
	v, cut := cutValue(value, maxValue)
	note := ""
	if cut {
		note = fmt.Sprintf(", first %d shown (raise --max-value, 0 for all)", len(v))
	}
	if tv := textCut(v, cut); printable(tv, true) {
		fmt.Fprintf(w, "value:      %d bytes, text%s\n%s\n", len(value), note, tv)
	} else {
		fmt.Fprintf(w, "value:      %d bytes, binary%s\n%s", len(value), note, hex.Dump(v))
	}
}

func showText(w io.Writer, r *kgo.Record, m retrytopic.Metadata, derr error, maxValue int) {
	fmt.Fprintf(w, "topic:      %s\npartition:  %d\noffset:     %d\ntimestamp:  %s\n", r.Topic, r.Partition, r.Offset, timeText(r.Timestamp))
	fmt.Fprintf(w, "key:        %s\n", keyText(r.Key))
	fmt.Fprintf(w, "headers:    %d\n", len(r.Headers))
	headersText(w, r.Headers)
	valueText(w, r.Value, maxValue)
	fmt.Fprintf(w, "metadata:\n")
	row := func(k, v string) {
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(w, "  %-19s %s\n", k+":", v)
	}
	row("id", m.ID)
	row("group", m.Group)
	row("attempt", strconv.Itoa(m.Attempt))
	row("class", m.Class.String())
	row("error", escape(m.Error))
	row("first failure", timeText(m.FirstFailure))
	row("last failure", timeText(m.LastFailure))
	row("original", fmt.Sprintf("%s/%d/%d", m.OriginalTopic, m.OriginalPartition, m.OriginalOffset))
	row("original timestamp", timeText(m.OriginalTimestamp))
	row("original key", keyTextOrEmpty(m.OriginalKey))
	if !m.Due.IsZero() {
		row("due", timeText(m.Due))
	}
	if m.Stage >= 0 {
		row("stage", strconv.Itoa(m.Stage))
	}
	if m.Parked {
		row("parked", "yes: waited behind an earlier record of its key")
	}
	if derr != nil {
		row("decode warning", derr.Error())
	}
}

func keyTextOrEmpty(k []byte) string {
	if k == nil {
		return ""
	}
	return keyText(k)
}

// hasHeader reports whether r carries a header named key.
func hasHeader(r *kgo.Record, key string) bool {
	for _, h := range r.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}
