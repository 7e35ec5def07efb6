package consumer

import (
	"unicode"
	"unicode/utf8"

	"github.com/kscope-dev/kscope/retrytopic"
)

// validateOwner checks Config.Owner: a header value people read, so
// printable text of a bounded length.
func (c Config) validateOwner(bad func(field, format string, args ...any)) {
	switch {
	case len(c.Owner) > retrytopic.MaxOwnerLength:
		bad("Owner", "is %d bytes long; keep it to %d bytes (a team and a contact, such as \"payments <#payments-oncall>\")", len(c.Owner), retrytopic.MaxOwnerLength)
	case !utf8.ValidString(c.Owner):
		bad("Owner", "is not valid UTF-8; write it as text, such as \"payments <#payments-oncall>\"")
	default:
		for _, r := range c.Owner {
			if unicode.IsControl(r) {
				bad("Owner", "holds the control character %q; write it on one line of printable text, such as \"payments <#payments-oncall>\"", r)
				return
			}
		}
	}
}
