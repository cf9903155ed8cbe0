package template

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/seamless-lb/seamless/entrypoint/haproxy"
	"github.com/seamless-lb/seamless/internal/testenv"
)

// splitWords splits one configuration line into words as HAProxy 2.6's
// parse_line does for the configuration file (comments, both quotes,
// backslash escapes, environment variables in double quotes). It exists to
// check haproxyQuote; TestSplitWordsAgreesWithHAProxy holds it to the real
// parser. Like HAProxy's reader, it skips leading blanks, drops an empty
// last word, and a NUL ends a word's C string.
func splitWords(line string, env map[string]string) ([]string, error) {
	line = strings.TrimLeft(line, " \t")
	var words []string
	var cur []byte
	squote, dquote := false, false
	i := 0
loop:
	for i < len(line) {
		c := line[i]
		switch {
		case c == 0 || c == '\n' || c == '\r':
			break loop
		case c == '#' && !squote && !dquote:
			break loop
		case c == '"' && !squote:
			dquote = !dquote
			i++
		case c == '\'' && !dquote:
			squote = !squote
			i++
		case c == '\\' && !squote:
			var next byte
			if i+1 < len(line) {
				next = line[i+1]
			}
			switch next {
			case ' ', '\\', '#', '\'', '"':
				cur = append(cur, next)
				i += 2
			case 't':
				cur = append(cur, '\t')
				i += 2
			case 'n':
				cur = append(cur, '\n')
				i += 2
			case 'r':
				cur = append(cur, '\r')
				i += 2
			case '$':
				if dquote {
					cur = append(cur, '$')
					i += 2
				} else {
					cur = append(cur, '\\')
					i++
				}
			case 'x':
				if i+3 >= len(line) || !isHex(line[i+2]) || !isHex(line[i+3]) {
					return nil, errors.New("truncated or invalid hexadecimal sequence")
				}
				v, _ := strconv.ParseUint(line[i+2:i+4], 16, 8)
				cur = append(cur, byte(v))
				i += 4
			default:
				cur = append(cur, '\\')
				i++
			}
		case isSpace(c) && !squote && !dquote:
			for i < len(line) && isSpace(line[i]) {
				i++
			}
			words = append(words, cString(cur))
			cur = cur[:0]
		case c == '$' && dquote:
			i++
			brace := i < len(line) && line[i] == '{'
			if brace {
				i++
			}
			start := i
			if i >= len(line) || !(isAlpha(line[i]) || line[i] == '_') {
				return nil, errors.New("invalid variable name")
			}
			for i < len(line) && (isAlpha(line[i]) || isDigit(line[i]) || line[i] == '_') {
				i++
			}
			name := line[start:i]
			value, set := env[name]
			if brace {
				if i < len(line) && line[i] == '-' {
					end := strings.IndexByte(line[i:], '}')
					if end < 0 {
						return nil, errors.New("unmatched brace")
					}
					if !set {
						value = line[i+1 : i+end]
					}
					i += end
				}
				if i >= len(line) || line[i] != '}' {
					return nil, errors.New("unmatched brace")
				}
				i++
			}
			cur = append(cur, value...)
		default:
			cur = append(cur, c)
			i++
		}
	}
	if squote || dquote {
		return nil, errors.New("unmatched quote")
	}
	if len(cur) > 0 {
		words = append(words, cString(cur))
	}
	return words, nil
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}
func isAlpha(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isHex(c byte) bool   { return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// cString is what C code sees of a word: up to its first NUL.
func cString(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

func TestSplitWords(t *testing.T) {
	env := map[string]string{"FOO": "bar"}
	tests := []struct {
		line string
		want []string
	}{
		{`server web 10.0.0.1:80 check`, []string{"server", "web", "10.0.0.1:80", "check"}},
		{`  leading   blanks	and tabs`, []string{"leading", "blanks", "and", "tabs"}},
		{`a # comment`, []string{"a"}},
		{`a\#b`, []string{"a#b"}},
		{`'a b'c"d e"`, []string{"a bc" + "d e"}},
		{`'a'\''b'`, []string{"a'b"}},
		{`'$FOO \x41 # "'`, []string{`$FOO \x41 # "`}},
		{`"$FOO ${FOO} ${NOPE-dflt} \$FOO"`, []string{"bar bar dflt $FOO"}},
		{`\$FOO`, []string{`\$FOO`}},
		{`a\ b \\ \q`, []string{"a b", `\`, `\q`}},
		{`\x41\x42`, []string{"AB"}},
		{`a '' b`, []string{"a", "", "b"}},
		{`a ''`, []string{"a"}},
		{"a\nb", []string{"a"}},
	}
	for _, tt := range tests {
		got, err := splitWords(tt.line, env)
		if err != nil {
			t.Errorf("splitWords(%q): %v", tt.line, err)
			continue
		}
		if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", tt.want) {
			t.Errorf("splitWords(%q) = %q, want %q", tt.line, got, tt.want)
		}
	}
	for _, bad := range []string{`'open`, `"open`, `\x4`, `"$1"`, `"${FOO"`} {
		if _, err := splitWords(bad, env); err == nil {
			t.Errorf("splitWords(%q) accepted", bad)
		}
	}
}

// noticeRe reads back what HAProxy prints for `.notice <word>`.
var noticeRe = regexp.MustCompile(`parsing \[[^\]]*:(\d+)\]: '(.*)'\.$`)

// haproxyWords asks the real HAProxy how it reads each line, as the single
// argument of a `.notice` directive; the result maps line index to the
// word HAProxy printed, or to "ERR" when it refused the line.
func haproxyWords(t *testing.T, lines []string, env map[string]string) map[int]string {
	t.Helper()
	bin := testenv.HAProxy(t)
	var cfg strings.Builder
	for _, l := range lines {
		cfg.WriteString(".notice " + l + "\n")
	}
	path := filepath.Join(t.TempDir(), "words.cfg")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", "-f", path)
	cmd.Env = haproxy.CleanEnv(os.Environ())
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, _ := cmd.CombinedOutput()
	got := map[int]string{}
	defer func() {
		if len(got) != len(lines) {
			t.Fatalf("HAProxy answered for %d of %d lines:\n%s", len(got), len(lines), out)
		}
	}()
	for _, l := range strings.Split(string(out), "\n") {
		if m := noticeRe.FindStringSubmatch(l); m != nil && strings.Contains(l, "[NOTICE]") {
			n, _ := strconv.Atoi(m[1])
			got[n-1] = m[2]
		} else if strings.Contains(l, "[ALERT]") && strings.Contains(l, "parsing [") {
			if m := regexp.MustCompile(`:(\d+)\]`).FindStringSubmatch(l); m != nil {
				n, _ := strconv.Atoi(m[1])
				got[n-1] = "ERR"
			}
		}
	}
	return got
}

// TestSplitWordsAgreesWithHAProxy runs lines through the real parser and
// through splitWords.
func TestSplitWordsAgreesWithHAProxy(t *testing.T) {
	env := map[string]string{"SEAMLESS_TEST_FOO": "bar"}
	lines := []string{
		`plain`,
		`'a b'c"d e"`,
		`'a'\''b'`,
		`'$SEAMLESS_TEST_FOO \x41 # "'`,
		`"$SEAMLESS_TEST_FOO/${SEAMLESS_TEST_FOO}/${SEAMLESS_TEST_NOPE-dflt}/\$SEAMLESS_TEST_FOO"`,
		`\$SEAMLESS_TEST_FOO`,
		`a\ b\\c\qd`,
		`\x41\x42\x7e`,
		`x\#y`,
		`'#not a comment'`,
		`"single ' inside"`,
		`'double " inside'`,
		`"esc \" \\ \' inside"`,
		`'back\slash'`,
		`'é ü 日本'`,
		`a'' # trailing comment`,
		`\x4`,
		`'unterminated`,
		`"$1"`,
	}
	real := haproxyWords(t, lines, env)
	for i, l := range lines {
		words, err := splitWords(l, env)
		want := "ERR"
		if err == nil {
			if len(words) != 1 {
				t.Fatalf("case %q splits into %d words; keep one per line", l, len(words))
			}
			want = words[0]
		}
		if got, ok := real[i]; !ok {
			t.Errorf("HAProxy printed nothing for %q", l)
		} else if got != want {
			t.Errorf("line %q: HAProxy reads %q, splitWords %q", l, got, want)
		}
	}
}

// TestHAProxyQuoteReadsBackExactly checks quoted words against the real
// parser: what HAProxy reads is the input.
func TestHAProxyQuoteReadsBackExactly(t *testing.T) {
	inputs := []string{
		"web", "a b", "it's", "'", "''", `\`, `\'`, "#hash", "a#b", "$HOME", "${HOME}", `"dq"`,
		`x\ny`, `\x41`, "-i", "--", "é ü", "100%", "a;b|c&d", "{}[]()<>", "~^*!?", "tab	less", " lead", "trail ", "nb\xa0sp", "\x85", "\xff",
	}
	lines := make([]string, len(inputs))
	for i, s := range inputs {
		lines[i] = HAProxyQuote(s)
	}
	real := haproxyWords(t, lines, map[string]string{"HOME": "/root"})
	for i, s := range inputs {
		if !HAProxyQuotable(s) {
			continue
		}
		if got := real[i]; got != s {
			t.Errorf("HAProxyQuote(%q) = %s, which HAProxy reads as %q", s, lines[i], got)
		}
	}
}
