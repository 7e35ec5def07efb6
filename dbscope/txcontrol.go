package dbscope

import (
	"fmt"
	"strings"

	"github.com/kscope-dev/kscope/consumer"
)

// endsTx returns the transaction-control command (COMMIT, ROLLBACK, ...)
// among the statements of sql that would end the transaction it runs in,
// or "". A handler runs its SQL in its batch's transaction, which also
// holds the inbox rows and the effects of the other records of the batch:
// a ROLLBACK there would undo their effects while their offsets commit,
// and a COMMIT would make the inbox rows of the records after it durable
// before their handlers run. A script with its own transaction control
// (BEGIN ...; COMMIT;) is the usual way this happens.
//
// sql is split into statements on the semicolons outside quotes, quoted
// identifiers, dollar quotes and comments; a statement ends the
// transaction when its first word is COMMIT, END, ABORT or ROLLBACK (but
// ROLLBACK TO, a savepoint of the handler's own), or it is PREPARE
// TRANSACTION.
func endsTx(sql string) string {
	if !strings.ContainsRune(sql, ';') {
		return endsStmt(sql)
	}
	start := 0
	for i := 0; i < len(sql); {
		switch c := sql[i]; {
		case c == ';':
			if cmd := endsStmt(sql[start:i]); cmd != "" {
				return cmd
			}
			i++
			start = i
		case c == '\'':
			// A string; E'...' strings take backslash escapes.
			escapes := i > 0 && (sql[i-1] == 'E' || sql[i-1] == 'e') && (i == 1 || !isIdent(sql[i-2]))
			i = skipQuoted(sql, i, '\'', escapes)
		case c == '"':
			i = skipQuoted(sql, i, '"', false)
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			if j := strings.IndexByte(sql[i:], '\n'); j >= 0 {
				i += j + 1
			} else {
				i = len(sql)
			}
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			i = skipBlockComment(sql, i)
		case c == '$' && (i == 0 || !isIdent(sql[i-1])):
			i = skipDollarQuoted(sql, i)
		default:
			i++
		}
	}
	return endsStmt(sql[start:])
}

// endsStmt returns the transaction-control command that one statement is,
// when it ends the transaction, or "".
func endsStmt(stmt string) string {
	w1, rest := firstWord(stmt)
	switch {
	case len(w1) < 3 || len(w1) > 8:
		return "" // no command below is shorter or longer: most statements stop here
	case strings.EqualFold(w1, "COMMIT"):
		return "COMMIT"
	case strings.EqualFold(w1, "END"):
		return "END"
	case strings.EqualFold(w1, "ABORT"):
		return "ABORT"
	case strings.EqualFold(w1, "ROLLBACK"):
		if w2, _ := firstWord(rest); strings.EqualFold(w2, "TO") {
			return "" // to a savepoint
		}
		return "ROLLBACK"
	case strings.EqualFold(w1, "PREPARE"):
		if w2, _ := firstWord(rest); strings.EqualFold(w2, "TRANSACTION") {
			return "PREPARE TRANSACTION"
		}
	}
	return ""
}

// firstWord returns the first word of s, past white space and comments,
// and what follows it.
func firstWord(s string) (word, rest string) {
	i := 0
	for i < len(s) {
		switch {
		case s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '(':
			i++
		case s[i] == '-' && i+1 < len(s) && s[i+1] == '-':
			if j := strings.IndexByte(s[i:], '\n'); j >= 0 {
				i += j + 1
			} else {
				i = len(s)
			}
		case s[i] == '/' && i+1 < len(s) && s[i+1] == '*':
			i = skipBlockComment(s, i)
		default:
			j := i
			for j < len(s) && isIdent(s[j]) {
				j++
			}
			return s[i:j], s[j:]
		}
	}
	return "", ""
}

func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c >= 0x80
}

// skipQuoted returns the index past the quoted text that starts at s[i]
// (q), where a doubled q stands for itself.
func skipQuoted(s string, i int, q byte, escapes bool) int {
	for i++; i < len(s); i++ {
		switch {
		case escapes && s[i] == '\\':
			i++
		case s[i] == q:
			if i+1 < len(s) && s[i+1] == q {
				i++
				continue
			}
			return i + 1
		}
	}
	return len(s)
}

// skipBlockComment returns the index past the comment that starts at s[i]
// ("/*"); PostgreSQL's block comments nest.
func skipBlockComment(s string, i int) int {
	depth := 0
	for i < len(s) {
		switch {
		case strings.HasPrefix(s[i:], "/*"):
			depth++
			i += 2
		case strings.HasPrefix(s[i:], "*/"):
			depth--
			i += 2
			if depth == 0 {
				return i
			}
		default:
			i++
		}
	}
	return len(s)
}

// skipDollarQuoted returns the index past the dollar-quoted string that
// starts at s[i] ($tag$...$tag$), or i+1 when s[i] starts none (a $1
// parameter).
func skipDollarQuoted(s string, i int) int {
	j := i + 1
	for j < len(s) && s[j] != '$' {
		if !isIdent(s[j]) || (j == i+1 && s[j] >= '0' && s[j] <= '9') {
			return i + 1
		}
		j++
	}
	if j >= len(s) {
		return i + 1
	}
	tag := s[i : j+1]
	if k := strings.Index(s[j+1:], tag); k >= 0 {
		return j + 1 + k + len(tag)
	}
	return len(s)
}

// errEndsTx is the failure of a record whose handler sent SQL that would
// end the batch's transaction: terminal, since the handler's SQL will do
// the same on every attempt.
func errEndsTx(cmd string) error {
	return consumer.Terminal(fmt.Errorf("dbscope: the handler's SQL runs %s, which would end the transaction its record shares with the other records of its batch (undoing or committing their work with it); the DB scope commits the transaction: remove the statement (return an error to roll the record's writes back, or use tx.Begin for a nested transaction of the handler's own)", cmd))
}
