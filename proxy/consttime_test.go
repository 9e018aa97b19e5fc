package proxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"

	"github.com/cube-sandbox/cubeproxy/internal/testenv"
)

// The auth package's own source check (auth/consttime_test.go) covers the
// compares it makes; the proxy holds the same secrets (the configured admin
// token, each route's traffic token, the token headers as received) and
// must hand them to auth rather than compare them itself, where no other
// test would notice: a plain == answers the same, only faster on an early
// mismatch.

// TestProxySecretsComparedInConstantTime reads the package's source: the
// admin API and the sandbox traffic path go through auth's constant-time
// checks, and nothing else compares a secret with ==, !=, <, > or an
// Equal/Compare/prefix helper (a compare with "" or nil is fine: emptiness
// is not secret).
func TestProxySecretsComparedInConstantTime(t *testing.T) {
	if problems := proxySecretProblems(t, testenv.PackageSources(t)); len(problems) > 0 {
		t.Fatalf("constant-time rules broken:\n%s", strings.Join(problems, "\n"))
	}
}

// TestProxySecretCheckerCatches proves the checker is not vacuous.
func TestProxySecretCheckerCatches(t *testing.T) {
	const good = `package proxy
func (a *Admin) authorized(ctx *fasthttp.RequestCtx) bool {
	if a.cfg.Token == "" { return false }
	return auth.AdminAuthorized([]byte(a.cfg.Token), ctx.Request.Header.Peek(auth.HeaderAdminToken))
}
func (p *Proxy) authorize(h *fasthttp.RequestHeader, r *routing.Route) bool {
	return auth.CheckTraffic(r.Public, r.TrafficToken, false, h) == nil && len(r.TrafficToken) != 0
}
`
	if p := proxySecretProblems(t, []string{good}); len(p) != 0 {
		t.Fatalf("good source flagged: %v", p)
	}
	bad := map[string][2]string{
		"admin ==":               {`return auth.AdminAuthorized([]byte(a.cfg.Token), ctx.Request.Header.Peek(auth.HeaderAdminToken))`, `return string(ctx.Request.Header.Peek(auth.HeaderAdminToken)) == a.cfg.Token`},
		"header bytes.Equal":     {`auth.CheckTraffic(r.Public, r.TrafficToken, false, h) == nil`, `bytes.Equal(h.Peek(auth.HeaderE2BTrafficToken), []byte(r.TrafficToken))`},
		"presented != stored":    {`len(r.TrafficToken) != 0`, `string(auth.PresentedTrafficToken(h)) != r.TrafficToken`},
		"prefix":                 {`len(r.TrafficToken) != 0`, `strings.HasPrefix(r.TrafficToken, "ab")`},
		"admin check bypassed":   {`return auth.AdminAuthorized(`, `return true || auth.NotAdminAuthorized(`},
		"traffic check bypassed": {`auth.CheckTraffic(`, `auth.CheckNothing(`},
	}
	for name, r := range bad {
		src := strings.Replace(good, r[0], r[1], 1)
		if src == good {
			t.Fatalf("%s: replacement did not apply", name)
		}
		if p := proxySecretProblems(t, []string{src}); len(p) == 0 {
			t.Errorf("%s: checker found nothing", name)
		}
	}
}

// proxySecretProblems lists the broken rules in srcs.
func proxySecretProblems(t *testing.T, srcs []string) []string {
	t.Helper()
	fset := token.NewFileSet()
	var problems []string
	found := map[string]bool{}
	for i, src := range srcs {
		f, err := parser.ParseFile(fset, "src"+string(rune('a'+i))+".go", src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			key := fn.Name.Name
			if fn.Recv != nil && len(fn.Recv.List) > 0 {
				if s, ok := fn.Recv.List[0].Type.(*ast.StarExpr); ok {
					if id, ok := s.X.(*ast.Ident); ok {
						key = id.Name + "." + key
					}
				}
			}
			switch key {
			case "Admin.authorized":
				found[key] = callsAuth(fn, "AdminAuthorized")
			case "Proxy.authorize":
				found[key] = callsAuth(fn, "CheckTraffic")
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.BinaryExpr:
					switch n.Op {
					case token.EQL, token.NEQ, token.LSS, token.GTR, token.LEQ, token.GEQ:
					default:
						return true
					}
					if (holdsSecret(n.X) && !emptiness(n.Y)) || (holdsSecret(n.Y) && !emptiness(n.X)) {
						problems = append(problems, fset.Position(n.Pos()).String()+": "+key+" compares a secret with "+n.Op.String())
					}
				case *ast.CallExpr:
					sel, ok := n.Fun.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					switch sel.Sel.Name {
					case "Equal", "EqualFold", "Compare", "HasPrefix", "HasSuffix", "DeepEqual":
					default:
						return true
					}
					for _, a := range n.Args {
						if holdsSecret(a) {
							problems = append(problems, fset.Position(n.Pos()).String()+": "+key+" compares a secret with "+sel.Sel.Name)
							break
						}
					}
				}
				return true
			})
		}
	}
	for _, key := range []string{"Admin.authorized", "Proxy.authorize"} {
		if !found[key] {
			problems = append(problems, key+": missing, or does not go through auth's constant-time check")
		}
	}
	return problems
}

// callsAuth reports whether fn calls auth.<name>.
func callsAuth(fn *ast.FuncDecl, name string) bool {
	ok := false
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		if c, is := n.(*ast.CallExpr); is {
			if s, is := c.Fun.(*ast.SelectorExpr); is && s.Sel.Name == name {
				if x, is := s.X.(*ast.Ident); is && x.Name == "auth" {
					ok = true
				}
			}
		}
		return !ok
	})
	return ok
}

// holdsSecret reports whether e reads a secret: a route's traffic token, the
// configured admin token (cfg.Token), or a token header's value as received
// (a Peek of one, auth.PresentedTrafficToken). len(...) of one is not.
func holdsSecret(e ast.Expr) bool {
	secret := false
	ast.Inspect(e, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "len" {
				return false
			}
			if s, ok := n.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "PresentedTrafficToken" {
				secret = true
			}
			if s, ok := n.Fun.(*ast.SelectorExpr); ok && (s.Sel.Name == "Peek" || s.Sel.Name == "PeekAll") && len(n.Args) == 1 {
				if a, ok := n.Args[0].(*ast.SelectorExpr); ok {
					switch a.Sel.Name {
					case "HeaderAdminToken", "HeaderE2BTrafficToken", "HeaderCubeTrafficToken":
						secret = true
					}
				}
			}
		case *ast.SelectorExpr:
			if n.Sel.Name == "TrafficToken" {
				secret = true
			}
			if x, ok := n.X.(*ast.SelectorExpr); ok && n.Sel.Name == "Token" && x.Sel.Name == "cfg" {
				secret = true
			}
		}
		return !secret
	})
	return secret
}

// emptiness reports whether e is "" or nil: comparing a secret with it
// reveals only whether one is configured.
func emptiness(e ast.Expr) bool {
	switch e := ast.Unparen(e).(type) {
	case *ast.BasicLit:
		return e.Kind == token.STRING && (e.Value == `""` || e.Value == "``")
	case *ast.Ident:
		return e.Name == "nil"
	}
	return false
}
