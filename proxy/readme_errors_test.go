package proxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/auth"
	"github.com/cube-sandbox/cubeproxy/routing"
)

// The README's error table is the clients' contract: every status and code
// the proxy answers with (every proxyError literal in this package) is in
// it, in the row of that status, and it lists nothing the proxy never
// answers.
func TestREADMEErrorTableMatchesCode(t *testing.T) {
	produced := producedErrors(t)
	documented := readmeErrorTable(t)
	for pair := range produced {
		if !documented[pair] {
			t.Errorf("the proxy answers %d %s: not in the README's error table", pair.status, pair.code)
		}
	}
	for pair := range documented {
		if !produced[pair] {
			t.Errorf("the README's error table lists %d %s: the proxy never answers it", pair.status, pair.code)
		}
	}
}

type statusCode struct {
	status int
	code   string
}

// producedErrors reads every proxyError{status: N, code: C} literal in the
// package's own files and resolves C to its value(s).
func producedErrors(t *testing.T) map[statusCode]bool {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	consts := map[string]string{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, af)
		for _, d := range af.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
				for _, s := range g.Specs {
					vs := s.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
								consts[n.Name], _ = strconv.Unquote(lit.Value)
							}
						}
					}
				}
			}
		}
	}
	targetCodes := []string{routing.CodeInvalidHost, routing.CodeInvalidPort, routing.CodeInvalidSandboxID,
		routing.CodeMissingTargetHeaders, routing.CodeDomainNotAllowed, routing.CodeInvalidPath}
	authCodes := []string{auth.CodeTrafficTokenMissing, auth.CodeTrafficTokenInvalid, auth.CodeTrafficTokenNotConfigured,
		auth.CodeSignedTokenMalformed, auth.CodeSignedTokenInvalid, auth.CodeSignedTokenWrongTarget,
		auth.CodeSignedTokenExpired, auth.CodeSignedCookieForeignOrigin}
	out := map[statusCode]bool{}
	for _, af := range parsed {
		ast.Inspect(af, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			if id, ok := lit.Type.(*ast.Ident); !ok || id.Name != "proxyError" {
				return true
			}
			var status int
			var codes []string
			for _, el := range lit.Elts {
				kv := el.(*ast.KeyValueExpr)
				switch kv.Key.(*ast.Ident).Name {
				case "status":
					status, _ = strconv.Atoi(kv.Value.(*ast.BasicLit).Value)
				case "code":
					switch v := kv.Value.(type) {
					case *ast.BasicLit:
						s, _ := strconv.Unquote(v.Value)
						codes = []string{s}
					case *ast.Ident:
						codes = []string{consts[v.Name]}
					case *ast.SelectorExpr:
						switch x := v.X.(*ast.Ident).Name + "." + v.Sel.Name; x {
						case "routing.CodeInvalidHost":
							codes = []string{routing.CodeInvalidHost}
						case "te.Code": // a *routing.TargetError
							codes = targetCodes
						case "rej.Code": // an *auth.Rejection
							codes = authCodes
						default:
							t.Fatalf("%s: code %s: teach this test its values", fset.Position(v.Pos()), x)
						}
					}
				}
			}
			for _, c := range codes {
				if status == 0 || c == "" {
					t.Fatalf("%s: proxyError with status %d code %q: teach this test to read it", fset.Position(lit.Pos()), status, c)
				}
				out[statusCode{status, c}] = true
			}
			return true
		})
	}
	return out
}

// readmeErrorTable reads the "## Errors" table of the README: the status
// at the start of each row's second cell, and every `code` in its third
// (`signed_token_*` standing for each signed token code).
func readmeErrorTable(t *testing.T) map[statusCode]bool {
	t.Helper()
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Errors\n")
	if !ok {
		t.Fatal("README has no ## Errors section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	status := regexp.MustCompile(`^\s*(\d{3})\b`)
	code := regexp.MustCompile("`([a-z_]+\\*?)`")
	signed := []string{auth.CodeSignedTokenMalformed, auth.CodeSignedTokenInvalid, auth.CodeSignedTokenWrongTarget, auth.CodeSignedTokenExpired}
	out := map[statusCode]bool{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 {
			continue
		}
		m := status.FindStringSubmatch(cells[2])
		if m == nil {
			continue // the header and separator rows
		}
		st, _ := strconv.Atoi(m[1])
		for _, c := range code.FindAllStringSubmatch(cells[3], -1) {
			if c[1] == "signed_token_*" {
				for _, s := range signed {
					out[statusCode{st, s}] = true
				}
				continue
			}
			out[statusCode{st, c[1]}] = true
		}
	}
	if len(out) == 0 {
		t.Fatal("no rows read from the README's error table")
	}
	return out
}

// Wherever the README's prose gives an answer as a status and its code
// ("404 `route_invalid`", "503 `store_unavailable`"), the proxy answers that
// code with that status: the table above is checked against the code, but
// the sections that describe one case at a time repeat the pair, and a
// status changed in one place would leave the others telling operators
// and client authors another.
func TestREADMEProseErrorsMatchCode(t *testing.T) {
	produced := producedErrors(t)
	statusOf := map[string]map[int]bool{}
	for p := range produced {
		if statusOf[p.code] == nil {
			statusOf[p.code] = map[int]bool{}
		}
		statusOf[p.code][p.status] = true
	}
	raw, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	pairs := regexp.MustCompile("\\b([1-5]\\d\\d) `([a-z_]+)`").FindAllStringSubmatch(string(raw), -1)
	checked := 0
	for _, m := range pairs {
		st, _ := strconv.Atoi(m[1])
		sts, ok := statusOf[m[2]]
		if !ok {
			continue // not one of the proxy's error codes (a log field, a setting)
		}
		checked++
		if !sts[st] {
			t.Errorf("README says %s `%s`: the proxy answers %s with %v", m[1], m[2], m[2], sts)
		}
	}
	if checked < 20 {
		t.Fatalf("README gives %d status-and-code pairs the proxy answers: is the pattern still right?", checked)
	}
}
