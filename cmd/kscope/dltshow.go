package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kscope-dev/kscope/retrytopic"
)

// dlt show: one dead-letter record in full, and the renderings of headers
// and values that outbox dead show shares.

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
	own, err := e.dltOwners(*f.group)
	if err != nil {
		return err
	}
	kc, cl, adm, err := e.kafkaAdmin(*f.brokers, f.timeouts)
	if err != nil {
		return err
	}
	defer cl.Close()

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
		s := showJSON(found, m, derr, maxValue)
		own.fill(&s.Metadata, m)
		return json.NewEncoder(e.stdout).Encode(s)
	}
	showText(e.stdout, found, m, derr, maxValue, own)
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

func showText(w io.Writer, r *kgo.Record, m retrytopic.Metadata, derr error, maxValue int, own *owners) {
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
	if owner, source := own.of(m); source == ownerFromPolicy {
		row("owner", escape(owner)+" (from the policy file: the record carries no kscope-owner header)")
	} else {
		row("owner", escape(owner))
	}
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
