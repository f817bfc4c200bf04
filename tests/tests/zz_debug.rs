use std::time::{Duration, Instant};
use vm_tests::host::pseudo_random;
use vm_tests::{GuestSpec, boot, exec_ok};

#[test]
fn debug() {
    vm_tests::scenario("debug", |driver| async move {
        let vm = boot(driver, &GuestSpec::new("debug")).await?;
        for n in [16_000usize, 32_000, 60_000, 65_536, 70_000, 100_000, 140_000] {
            let blob = pseudo_random(n, 5);
            let p = format!("b{n}.bin");
            let t = Instant::now();
            vm.write_file(&p, &blob).await.map_err(|e| format!("write {n}: {}", vm_tests::error_chain(&e)))?;
            let w = t.elapsed();
            let t = Instant::now();
            let r = vm.read_file(&p).await;
            eprintln!("size {n}: write {w:?}, read {:?} -> {:?}", t.elapsed(), r.as_ref().map(|b| b.len()).map_err(|e| vm_tests::error_chain(e)));
        }
        for n in [10_000usize, 100_000, 300_000] {
            let t = Instant::now();
            let r = vm.exec(&format!("head -c {n} /dev/zero")).await;
            eprintln!("exec size {n}: {:?} -> {:?}", t.elapsed(), r.as_ref().map(|o| o.output.len()).map_err(|e| vm_tests::error_chain(e)));
        }
        return Ok(());
        // serve debugging
        vm.write_file("srv/index.html", b"hi\n").await.map_err(|e| e.to_string())?;
        let spec = vm_sandbox::ServeSpec {
            argv: ["httpd", "-f", "-v", "-p", "127.0.0.1:8000", "-h", "/work/srv"].iter().map(|s| s.to_string()).collect(),
            publish: vm_sandbox::PublishSpec::parse("0:8000").unwrap(),
        };
        let s = vm.serve(spec).await.map_err(|e| vm_tests::error_chain(&e))?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        eprintln!("running {} exit {:?} output {:?}", s.running(), s.exit(), s.output());
        eprintln!("{}", exec_ok(&vm, "netstat -ltn 2>&1; ps; wget -O - http://127.0.0.1:8000/index.html 2>&1").await.unwrap_or_else(|e| e));
        let t = Instant::now();
        let f = tokio::time::timeout(Duration::from_secs(10), vm.machine().forward(8000)).await;
        eprintln!("forward: {:?} after {:?}", f.as_ref().map(|r| r.as_ref().map(|_| ()).map_err(|e| vm_tests::error_chain(e))), t.elapsed());
        if let Ok(Ok(mut st)) = f {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            st.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").await.unwrap();
            let mut out = Vec::new();
            let r = tokio::time::timeout(Duration::from_secs(10), st.read_to_end(&mut out)).await;
            eprintln!("forward read: {r:?} {:?}", String::from_utf8_lossy(&out));
        }
        eprintln!("running {} exit {:?} output {:?}", s.running(), s.exit(), s.output());
        s.stop().await.map_err(|e| e.to_string())?;
        vm.close().await;
        Ok(())
    });
}
