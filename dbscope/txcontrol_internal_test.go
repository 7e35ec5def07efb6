package dbscope

import "testing"

func TestEndsTx(t *testing.T) {
	for _, c := range []struct{ sql, want string }{
		{"COMMIT", "COMMIT"},
		{"  commit;", "COMMIT"},
		{"commit and chain", "COMMIT"},
		{"END", "END"},
		{"end transaction", "END"},
		{"ABORT", "ABORT"},
		{"ROLLBACK", "ROLLBACK"},
		{"rollback work", "ROLLBACK"},
		{"PREPARE TRANSACTION 'x'", "PREPARE TRANSACTION"},
		{"-- a script\nBEGIN; UPDATE t SET a = 1; COMMIT;", "COMMIT"},
		{"/* outer /* nested */ still */ ROLLBACK", "ROLLBACK"},
		{"UPDATE t SET a = 1;\n\tEnd", "END"},
		{"INSERT INTO t VALUES (1); ROLLBACK", "ROLLBACK"},

		{"INSERT INTO effects VALUES ($1, $2)", ""},
		{"ROLLBACK TO SAVEPOINT mine", ""},
		{"rollback to mine", ""},
		{"PREPARE stmt AS SELECT 1", ""},
		{"SELECT 'x; COMMIT'", ""},
		{"SELECT E'it\\'s; COMMIT'", ""},
		{"SELECT 'it''s; ROLLBACK'", ""},
		{`SELECT "a;commit" FROM t`, ""},
		{"SELECT 1 -- ; COMMIT\n", ""},
		{"SELECT 1 /* ; END */", ""},
		{"DO $$ BEGIN PERFORM 1; END $$", ""},
		{"DO $body$ BEGIN RAISE NOTICE 'a;'; END; $body$; SELECT 2", ""},
		{"SELECT $1; SELECT $2", ""},
		{"SELECT committed FROM t", ""},
		{"UPDATE ledger SET state = 'COMMIT' WHERE id = $1", ""},
		{"", ""},
	} {
		if got := endsTx(c.sql); got != c.want {
			t.Errorf("endsTx(%q) = %q, want %q", c.sql, got, c.want)
		}
	}
}

func FuzzEndsTx(f *testing.F) {
	for _, s := range []string{"COMMIT", "SELECT 'a;b'", "DO $$ x; $$; END", "/* /* */", "E'\\'", "$a$"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		endsTx(sql) // never panics, always ends
	})
}

func BenchmarkEndsTx(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		endsTx("insert into effects (message_id, key, seq) values ($1, $2, $3)")
	}
}
